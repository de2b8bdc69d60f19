"""Coverage gates: each failing case names the event, version and context; each has a pass.

Gates on the topology run where the lint runs (role start, ``ferry lint``); gates on the
manifests themselves run in ``ferry registry check``, here on a copy of the project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.contracts.codegen import check

from .conftest import SEA_VIBESPRO, edit_yaml, lint_doc, shipped

SEA_MANIFEST = "manifests/sea-vibespro/sea.yaml"
VIBESPRO_MANIFEST = "manifests/sea-vibespro/vibespro.yaml"
SCHEMA = {"type": "object", "required": ["vibe_id"], "properties": {"vibe_id": {"type": "string"}}}


def _found(root: Path, rule: str) -> list[str]:
    return [str(p) for p in check(root) if p.rule == rule]


def test_unreceived_event(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["durables"]["sea__from_vibespro"]["filter_subjects"] = ["vibespro.event.vibe_created.v1"]
    assert lint_doc(tmp_path, doc) == [
        f"{SEA_MANIFEST}: handles.vibespro.vibe_created.v2: context sea handles vibe_created v2 "
        "of context vibespro, but no durable targeting sea has a filter covering "
        "vibespro.event.vibe_created.v2 (stream VIBESPRO_EVENTS): the event would never reach "
        "its handler [unreceived-event]"
    ]


def test_received_through_narrow_filters(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["durables"]["sea__from_vibespro"]["filter_subjects"] = [
        "vibespro.event.vibe_created.v1",
        "vibespro.event.vibe_created.v2",
    ]
    assert lint_doc(tmp_path, doc) == []


def test_handler_for_an_event_nobody_publishes(project: Path) -> None:
    def handle_unpublished(doc: dict[str, Any]) -> None:
        doc["handles"].append(
            {"producer": "vibespro", "type": "vibe_deleted", "version": 1,
             "handler": "services.handlers.contexts.sea:vibe_created_v1"}
        )  # fmt: skip

    edit_yaml(project / SEA_MANIFEST, handle_unpublished)
    assert _found(project, "unpublished-event") == [
        f"{SEA_MANIFEST}: handles.vibespro.vibe_deleted.v1: context sea handles vibe_deleted v1 "
        "of context vibespro, but no manifest publishes it (vibespro publishes: "
        "vibe_created.v1, vibe_created.v2) [unpublished-event]"
    ]


def test_published_version_nobody_handles(project: Path) -> None:
    def publish_v3(doc: dict[str, Any]) -> None:
        doc["publishes"].append({"type": "vibe_created", "version": 3, "schema": SCHEMA})

    edit_yaml(project / VIBESPRO_MANIFEST, publish_v3)
    problems = check(project)
    assert [str(p) for p in problems if p.rule == "unhandled-event"] == [
        f"{VIBESPRO_MANIFEST}: publishes.vibe_created.v3: context vibespro publishes "
        "vibe_created v3, but no context handles it: its messages would reach no handler "
        "[unhandled-event]"
    ]
    # SEA's durable takes every vibespro subject, so v3 would also be dead-lettered there.
    assert [str(p) for p in problems if p.rule == "unexpected-delivery"] == [
        f"{SEA_VIBESPRO}: durables.sea__from_vibespro.filter_subjects: delivers vibe_created v3 "
        "of context vibespro (vibespro.event.vibe_created.v3) to context sea, which has no "
        "handler for it: every such message would be dead-lettered as UNKNOWN_EVENT "
        "[unexpected-delivery]"
    ]


def test_published_version_handled_passes_the_gates(project: Path) -> None:
    def publish_v3(doc: dict[str, Any]) -> None:
        doc["publishes"].append({"type": "vibe_created", "version": 3, "schema": SCHEMA})

    def handle_v3(doc: dict[str, Any]) -> None:
        doc["handles"].append(
            {"producer": "vibespro", "type": "vibe_created", "version": 3,
             "handler": "services.handlers.contexts.sea:vibe_created_v1"}
        )  # fmt: skip

    edit_yaml(project / VIBESPRO_MANIFEST, publish_v3)
    edit_yaml(project / SEA_MANIFEST, handle_v3)
    gates = {"unhandled-event", "unexpected-delivery", "unreceived-event", "unpublished-event"}
    assert [p for p in check(project) if p.rule in gates] == []


def test_durable_delivering_what_its_context_does_not_handle(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["durables"]["vibespro__from_vibespro"] = {
        **doc["durables"]["sea__from_vibespro"],
        "target": "vibespro",
        "dead_letter_subject": "vibespro.dlq.vibespro__from_vibespro",
    }
    assert lint_doc(tmp_path, doc) == [
        f"{SEA_VIBESPRO}: durables.vibespro__from_vibespro.filter_subjects: delivers "
        f"vibe_created v{n} of context vibespro (vibespro.event.vibe_created.v{n}) to context "
        "vibespro, which has no handler for it: every such message would be dead-lettered as "
        "UNKNOWN_EVENT [unexpected-delivery]"
        for n in (1, 2)
    ]


def test_topology_without_manifests(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["name"] = "sea-vibespro-staging"
    assert lint_doc(tmp_path, doc) == [
        f"{SEA_VIBESPRO}: name: no events are declared for topology 'sea-vibespro-staging': "
        "declare them in manifests/sea-vibespro-staging/<context>.yaml and run "
        "`ferry registry generate` [missing-manifests]"
    ]
