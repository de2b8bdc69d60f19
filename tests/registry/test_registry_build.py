"""Registry generation, staleness, the schema lock (immutable versions) and manifest errors.

``test_the_shipped_registry_is_current_and_clean`` is CI's gate: it fails when
``shared/contracts/registry.json`` or ``manifests/schemas.lock`` is stale, a locked version
changed, a handler reference is broken, or either shipped topology fails a lint rule or a
coverage gate.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from shared.cli.main import main as ferry
from shared.contracts.codegen import (
    LOCK,
    REGISTRY,
    ROUTE_FORMS,
    check,
    generate,
    read_lock,
)
from shared.contracts.loading import load_topology
from shared.contracts.manifests import fingerprint
from shared.contracts.registry_file import read_registry
from shared.domain.errors import ConfigurationError
from tests.conftest import ROOT

from .conftest import edit_yaml, read_yaml

VIBESPRO = "manifests/sea-vibespro/vibespro.yaml"
SEA = "manifests/sea-vibespro/sea.yaml"
STALE_REGISTRY = (
    f"{REGISTRY}: (file): differs from what the manifests generate (first at line {{line}}): "
    "run `ferry registry generate` and commit the result [stale-registry]"
)


def _strs(root: Path) -> list[str]:
    return [str(p) for p in check(root)]


def _version(doc: dict[str, Any], version: int) -> dict[str, Any]:
    entry: dict[str, Any] = next(e for e in doc["publishes"] if e["version"] == version)
    return entry


def _line_of(root: Path, text: str) -> int:
    lines = (root / REGISTRY).read_text().splitlines()
    return next(n for n, line in enumerate(lines, start=1) if text in line)


def test_the_shipped_registry_is_current_and_clean() -> None:
    assert [str(p) for p in check(ROOT)] == []


def test_ferry_registry_check_and_lint_exit_0_on_the_shipped_tree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ferry(["registry", "check"]) == 0
    assert ferry(["lint", "--topology", str(ROOT / "topologies/mediation.yaml")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "registry, lock and topologies clean",
        f"{ROOT / 'topologies/mediation.yaml'}: clean",
    ]


def test_generation_is_deterministic(project: Path) -> None:
    first = (project / REGISTRY).read_bytes()
    assert generate(project).written == []
    assert (project / REGISTRY).read_bytes() == first == (ROOT / REGISTRY).read_bytes()

    def shuffle(doc: dict[str, Any]) -> None:
        """Same declarations, other order: entries, keys, properties."""
        doc["publishes"].reverse()
        for entry in doc["publishes"]:
            schema = entry["schema"]
            schema["properties"] = dict(reversed(list(schema["properties"].items())))
            entry["schema"] = dict(reversed(list(schema.items())))
        doc.update(reversed(list(doc.items())))

    edit_yaml(project / VIBESPRO, shuffle)
    assert generate(project).written == []
    assert (project / REGISTRY).read_bytes() == first


def test_a_changed_manifest_makes_the_registry_stale_until_regenerated(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = "A model was published (or renamed) in SEA."
    line = _line_of(project, old)

    def describe(doc: dict[str, Any]) -> None:
        doc["publishes"][0]["description"] = "A model went live."

    edit_yaml(project / SEA, describe)
    assert _strs(project) == [STALE_REGISTRY.format(line=line)]
    assert ferry(["registry", "check", "--root", str(project)]) == 1
    assert STALE_REGISTRY.format(line=line) in capsys.readouterr().out
    assert generate(project).written == [REGISTRY]
    assert _strs(project) == []
    assert "A model went live." in (project / REGISTRY).read_text()


def test_a_missing_registry_is_stale(project: Path) -> None:
    (project / REGISTRY).unlink()
    assert _strs(project) == [
        f"{REGISTRY}: (file): is missing: run `ferry registry generate` and commit the result "
        "[stale-registry]"
    ]


def test_a_new_version_is_locked_by_generate(project: Path) -> None:
    def publish_v3(doc: dict[str, Any]) -> None:
        v3 = copy.deepcopy(_version(doc, 2))
        v3["version"] = 3
        v3["schema"]["required"].append("mood")
        v3["schema"]["properties"]["mood"] = {"type": "string"}
        doc["publishes"].append(v3)

    def handle_v3(doc: dict[str, Any]) -> None:
        doc["handles"].append(
            {"producer": "vibespro", "type": "vibe_created", "version": 3,
             "handler": "services.handlers.contexts.sea:vibe_created_v2"}
        )  # fmt: skip

    edit_yaml(project / VIBESPRO, publish_v3)
    edit_yaml(project / SEA, handle_v3)
    problems = _strs(project)
    assert (
        f"{VIBESPRO}: publishes.vibe_created.v3: vibe_created v3 of context vibespro is not in "
        f"{LOCK} yet: run `ferry registry generate` and commit the result [stale-registry]"
    ) in problems
    assert {p.rule for p in check(project)} == {"stale-registry"}
    result = generate(project)
    assert result.locked == ["sea-vibespro/vibespro/vibe_created.v3"]
    assert result.written == [LOCK, REGISTRY]
    schema = _version(read_yaml(project / VIBESPRO), 3)["schema"]
    assert read_lock(project / LOCK)["sea-vibespro/vibespro/vibe_created.v3"] == fingerprint(schema)
    assert _strs(project) == []


def test_a_breaking_change_to_a_locked_version_fails_and_points_to_the_next(
    project: Path,
) -> None:
    locked = read_lock(project / LOCK)["sea-vibespro/vibespro/vibe_created.v1"]

    def break_v1(doc: dict[str, Any]) -> None:
        _version(doc, 1)["schema"]["required"].append("owner_id")

    edit_yaml(project / VIBESPRO, break_v1)
    changed = fingerprint(_version(read_yaml(project / VIBESPRO), 1)["schema"])
    expected = (
        f"{VIBESPRO}: publishes.vibe_created.v1.schema: vibe_created v1 of context vibespro is "
        f"locked at {locked[:19]}, but its schema now fingerprints as {changed[:19]}: a "
        "published version never changes; declare the change as vibe_created.v3 "
        "[immutable-version]"
    )
    assert expected in _strs(project)
    before = {path: (project / path).read_bytes() for path in (LOCK, REGISTRY)}
    with pytest.raises(ConfigurationError) as refused:
        generate(project)
    assert str(refused.value) == f"refusing to generate: {expected}"
    assert {path: (project / path).read_bytes() for path in (LOCK, REGISTRY)} == before


def test_documentation_changes_keep_the_fingerprint(project: Path) -> None:
    def document(doc: dict[str, Any]) -> None:
        schema = _version(doc, 1)["schema"]
        schema["title"] = "VibeCreated v1"
        schema["properties"]["title"]["description"] = "Shown in the vibe list."

    edit_yaml(project / VIBESPRO, document)
    assert {p.rule for p in check(project)} == {"stale-registry"}
    assert generate(project).locked == []
    assert _strs(project) == []


def test_a_removed_version_cannot_come_back_with_another_schema(project: Path) -> None:
    def drop_v2(doc: dict[str, Any]) -> None:
        doc["publishes"] = [e for e in doc["publishes"] if e["version"] != 2]

    def unhandle_v2(doc: dict[str, Any]) -> None:
        doc["handles"] = [h for h in doc["handles"] if h["version"] != 2]

    original = read_yaml(project / VIBESPRO)
    edit_yaml(project / VIBESPRO, drop_v2)
    edit_yaml(project / SEA, unhandle_v2)
    generate(project)
    assert "sea-vibespro/vibespro/vibe_created.v2" in read_lock(project / LOCK)

    def bring_back_v2(doc: dict[str, Any]) -> None:
        v2 = copy.deepcopy(_version(original, 2))
        v2["schema"]["properties"]["owner_id"] = {"type": "integer"}
        doc["publishes"].append(v2)

    edit_yaml(project / VIBESPRO, bring_back_v2)
    assert "immutable-version" in {p.rule for p in check(project)}


@pytest.mark.parametrize(
    ("handler", "reason"),
    [
        (
            "services.handlers.contexts.sea:vibe_created_v9",
            "module services.handlers.contexts.sea has no vibe_created_v9",
        ),
        (
            "services.handlers.contexts.sea:text",
            ROUTE_FORMS,
        ),
        (
            "services.handlers.contexts.nope:vibe_created_v2",
            "module services.handlers.contexts.nope cannot be imported "
            "(No module named 'services.handlers.contexts.nope')",
        ),
    ],
)
def test_a_handler_reference_that_does_not_resolve(
    project: Path, handler: str, reason: str
) -> None:
    def rename(doc: dict[str, Any]) -> None:
        doc["handles"][1]["handler"] = handler

    edit_yaml(project / SEA, rename)
    assert [str(p) for p in check(project) if p.rule == "handler-missing"] == [
        f"{SEA}: handles.vibespro.vibe_created.v2.handler: {handler}: {reason} [handler-missing]"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: _version(d, 2)["schema"]["properties"]["title"].update(type="strng"),
            f"{VIBESPRO}: publishes.vibe_created.v2: schema.properties.title.type: 'strng' is "
            "not valid under any of the given schemas",
        ),
        (
            lambda d: _version(d, 1)["schema"].update(
                {"$schema": "http://json-schema.org/draft-07/schema#"}
            ),
            f"{VIBESPRO}: publishes.vibe_created.v1: schema: $schema must be "
            "https://json-schema.org/draft/2020-12/schema (draft 2020-12), not "
            "'http://json-schema.org/draft-07/schema#'",
        ),
        (
            lambda d: _version(d, 1)["schema"].update(type="array"),
            f"{VIBESPRO}: publishes.vibe_created.v1: schema: a payload is a JSON object: the "
            "schema needs type: object",
        ),
        (
            lambda d: d["publishes"].append(copy.deepcopy(_version(d, 2))),
            f"{VIBESPRO}: publishes: vibe_created.v2 is declared twice",
        ),
        (
            lambda d: d.update(context="vibes"),
            f"{VIBESPRO}: context: 'vibes' does not match the file name (expected 'vibespro')",
        ),
        (
            lambda d: _version(d, 1).update(type="VibeCreated"),
            f"{VIBESPRO}: publishes.VibeCreated.v1: event type 'VibeCreated' must be snake_case",
        ),
    ],
)
def test_manifest_errors_name_file_and_field(project: Path, change: Any, message: str) -> None:
    edit_yaml(project / VIBESPRO, change)
    with pytest.raises(ConfigurationError) as refused:
        check(project)
    assert str(refused.value) == message


def test_manifests_for_unknown_contexts_and_topologies(project: Path) -> None:
    (project / "manifests/sea-vibespro/billing.yaml").write_text("context: billing\n")
    (project / "manifests/ghost").mkdir()
    problems = _strs(project)
    assert (
        "manifests/sea-vibespro/billing.yaml: context: topology 'sea-vibespro' "
        "(topologies/sea-vibespro.yaml) has no context 'billing' (known: sea, vibespro) "
        "[unknown-context]"
    ) in problems
    assert (
        "manifests/ghost: (directory): no topology file is named 'ghost' "
        "(known: mediation, sea-vibespro) [unknown-topology]"
    ) in problems


def test_a_malformed_lock_is_refused(project: Path) -> None:
    line = len((project / LOCK).read_text().splitlines()) + 1
    with (project / LOCK).open("a") as lock:
        lock.write("sea-vibespro/sea/model_published.v2 not-a-fingerprint\n")
    with pytest.raises(ConfigurationError, match=rf"^{LOCK}: line {line}: expected"):
        check(project)


def test_a_topology_file_may_not_declare_events(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text((ROOT / "topologies/sea-vibespro.yaml").read_text() + "events: []\n")
    with pytest.raises(ConfigurationError) as refused:
        load_topology(path)
    assert str(refused.value) == (
        f"{path}: events: events are declared in manifests/<topology>/<context>.yaml and "
        "compiled by `ferry registry generate`, not in the topology file"
    )


def test_the_registry_file_holds_what_the_manifests_declare(project: Path) -> None:
    doc = json.loads((project / REGISTRY).read_text())
    assert (doc["format"], doc["format_version"]) == ("ferry-registry", 1)
    assert doc["lock"] == read_lock(project / LOCK)
    v2 = next(
        e
        for e in doc["topologies"]["sea-vibespro"]
        if (e["type"], e["version"]) == ("vibe_created", 2)
    )
    declared = _version(read_yaml(project / VIBESPRO), 2)
    assert v2["schema"] == declared["schema"]
    assert v2["fingerprint"] == fingerprint(declared["schema"])
    assert v2["handlers"] == [
        {"context": "sea", "handler": "services.handlers.contexts.sea:vibe_created_v2",
         "manifest": SEA}
    ]  # fmt: skip
    assert "ordering_key" not in v2
    assert read_registry(project / REGISTRY).declared("sea-vibespro")[2].schema == v2["schema"]


def test_a_hand_edited_registry_file_is_stale_and_refused_at_start(project: Path) -> None:
    path = project / REGISTRY
    doc = json.loads(path.read_text())
    doc["topologies"]["sea-vibespro"][0]["schema"]["required"] = []
    path.write_text(json.dumps(doc))
    first = "topologies.sea-vibespro[0](model_published.v1): the schema fingerprints as "
    with pytest.raises(ConfigurationError, match=re.escape(f"{path}: {first}")):
        read_registry(path)
    [stale] = _strs(project)
    assert stale.startswith(f"{REGISTRY}: (file): is not a valid registry file ({first}")
    assert stale.endswith("run `ferry registry generate` and commit the result [stale-registry]")
