"""What the workers take from the registry: events, routes, payload validation."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from services.handlers.specs import SERVICES
from services.inbox_consumer.__main__ import accepted_events
from shared.contracts.events import active_registry, check_outgoing
from shared.contracts.loading import load_topology
from shared.domain.errors import ConfigurationError, OutboxValidationError
from tests.conftest import ROOT

from .conftest import SEA_VIBESPRO, load_doc, shipped

SHIPPED = ROOT / "shared/contracts/registry.json"


def test_a_loaded_topology_carries_its_declared_events() -> None:
    topology = load_topology(ROOT / SEA_VIBESPRO)
    assert [(e.context, e.name, e.handled_by, e.handlers) for e in topology.events] == [
        ("sea", "model_published.v1", ["vibespro__from_sea"],
         {"vibespro": "services.handlers.contexts.vibespro:model_published_v1"}),
        ("vibespro", "vibe_created.v1", ["sea__from_vibespro"],
         {"sea": "services.handlers.contexts.sea:vibe_created_v1"}),
        ("vibespro", "vibe_created.v2", ["sea__from_vibespro"],
         {"sea": "services.handlers.contexts.sea:vibe_created_v2"}),
    ]  # fmt: skip
    assert all(e.manifest.startswith("manifests/sea-vibespro/") for e in topology.events)


def test_handled_by_follows_the_deployed_filters(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["durables"]["sea__from_vibespro"]["filter_subjects"] = ["vibespro.event.*.v2"]
    topology = load_doc(tmp_path, doc)
    assert {e.name: e.handled_by for e in topology.events if e.context == "vibespro"} == {
        "vibe_created.v1": [],
        "vibe_created.v2": ["sea__from_vibespro"],
    }


def test_a_topology_file_lacking_a_declared_context_is_refused(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    del doc["contexts"]["vibespro"]["stream"]
    doc["durables"] = {"vibespro__from_sea": doc["durables"]["vibespro__from_sea"]}
    doc["contexts"]["vibestore"] = doc["contexts"].pop("vibespro")
    doc["durables"]["vibespro__from_sea"]["target"] = "vibestore"
    with pytest.raises(ConfigurationError) as refused:
        load_doc(tmp_path, doc)
    assert str(refused.value) == (
        f"{tmp_path / 'topology.yaml'}: contexts: the registry's events for topology "
        f"'sea-vibespro' ({ROOT / 'shared/contracts/registry.json'}) name context(s) vibespro, "
        "which this file lacks"
    )


def _resolve(reference: str) -> object:
    module, _, function = reference.partition(":")
    return getattr(importlib.import_module(module), function)


def test_handler_services_route_what_the_manifests_name() -> None:
    """Every route of every example service is the function its manifest names, and back
    (module_g's replay-job route is the platform's, ``shared.ops.replay_jobs``, which the
    module re-exports under the name its manifest gives)."""
    named = {
        (binding.context, event.type, event.version): _resolve(binding.handler)
        for _, event in active_registry().all_events()
        for binding in event.handlers
    }
    routed = {
        (name, *key): route for name, spec in SERVICES.items() for key, route in spec.routes.items()
    }
    assert routed == named


def test_the_consumer_accepts_v1_and_v2_side_by_side_each_with_its_schema() -> None:
    accepted = accepted_events(load_topology(ROOT / SEA_VIBESPRO), "sea__from_vibespro")
    assert accepted == {("vibe_created", 1), ("vibe_created", 2)}
    assert accepted is not None
    v1_payload = {"vibe_id": "v1", "title": "t"}
    assert accepted.payload_error(("vibe_created", 1), v1_payload) is None
    assert accepted.payload_error(("vibe_created", 2), v1_payload) == (
        "vibe_created.v2: payload.owner_id: required property is missing"
    )
    assert accepted.payload_error(("vibe_created", 1), {"vibe_id": 7, "title": ["t"]}) == (
        "vibe_created.v1: payload.title: ['t'] is not of type 'string'; "
        "payload.vibe_id: 7 is not of type 'string'"
    )


def test_a_topology_without_declared_events_accepts_anything(tmp_path: Path) -> None:
    doc = shipped(SEA_VIBESPRO)
    doc["name"] = "sea-vibespro-staging"
    assert accepted_events(load_doc(tmp_path, doc), "sea__from_vibespro") is None


@pytest.mark.parametrize(
    ("event", "payload", "context", "message"),
    [
        (
            ("vibe_created", 2), {"vibe_id": "v1", "title": "t"}, None,
            "SCHEMA_INVALID: payload: vibe_created.v2 of context vibespro: payload.owner_id: "
            "required property is missing",
        ),
        (
            ("vibe_created", 3), {"vibe_id": "v1"}, None,
            "UNDECLARED_EVENT: event_type: vibe_created.v3 is declared by no manifest "
            "(declared versions: v1, v2)",
        ),
        (
            ("vibe_deleted", 1), {}, None,
            "UNDECLARED_EVENT: event_type: vibe_deleted.v1 is declared by no manifest "
            f"(registry {SHIPPED}: add it to the manifests, `ferry registry generate` and "
            "restart)",
        ),
        (
            ("vibe_created", 1), {"vibe_id": "v1", "title": "t"}, "sea",
            "UNDECLARED_EVENT: event_type: vibe_created.v1 is not declared in context sea's "
            f"manifest (registry {SHIPPED}: add it to the manifests, `ferry registry generate` "
            "and restart)",
        ),
    ],
)  # fmt: skip
def test_the_producer_check_names_what_is_wrong(
    event: tuple[str, int], payload: dict[str, object], context: str | None, message: str
) -> None:
    with pytest.raises(OutboxValidationError) as refused:
        check_outgoing(*event, payload, context=context)
    assert str(refused.value) == message


def test_the_producer_check_passes_declared_valid_payloads() -> None:
    check_outgoing("vibe_created", 1, {"vibe_id": "v1", "title": "t", "extra": 1})
    check_outgoing("vibe_created", 2, {"vibe_id": "v1", "title": "t", "owner_id": "u"})
    scored = {"opportunity_key": "o", "score": 1}
    check_outgoing("opportunity_scored", 1, scored, context="module_e")
