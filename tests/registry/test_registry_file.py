"""A team's registry outside Ferry's tree: generated to a file, loaded through FERRY_REGISTRY.

The team's directory holds its topology, its manifests and its handler module and nothing
of Ferry's; ``ferry`` and the roles are run from another working directory, so every path
must come from settings or options. The lock, the coverage gates and ``ferry registry
check`` behave on the file as on Ferry's own registry; a damaged file is refused with
what is wrong and where, whatever it holds (hypothesis).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.adapters.postgres import migrate_database
from shared.adapters.producer import record_event
from shared.contracts.codegen import Layout, check, generate
from shared.contracts.events import check_outgoing, use_registry
from shared.contracts.loading import load_topology
from shared.contracts.registry_file import parse_registry, read_registry
from shared.domain.errors import ConfigurationError, OutboxValidationError
from tests.conftest import ROOT

TOPOLOGY: dict[str, Any] = {
    "name": "orders",
    "contexts": {
        "shop": {
            "database": "shop",
            "namespace": "shop.event",
            "dead_letter_subject": "shop.dlq",
            "stream": {
                "name": "SHOP_EVENTS",
                "subjects": ["shop.event.>"],
                "max_age": "7d",
                "duplicate_window": "2m",
            },
        },
        "billing": {
            "database": "billing",
            "namespace": "billing.event",
            "dead_letter_subject": "billing.dlq",
        },
    },
    "durables": {
        "billing__from_shop": {
            "stream": "SHOP_EVENTS",
            "target": "billing",
            "filter_subjects": ["shop.event.>"],
            "max_ack_pending": 200,
            "handler": {"url": "http://127.0.0.1:9301/handle", "timeout": "10s"},
            "dead_letter_subject": "billing.dlq.billing__from_shop",
        }
    },
    "dead_letter_streams": [{"name": "BILLING_DLQ", "subjects": ["billing.dlq.>"]}],
}
ORDER_PLACED = {
    "type": "order_placed",
    "version": 1,
    "description": "A customer placed an order.",
    "schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["order_id", "total_cents"],
        "properties": {
            "order_id": {"type": "string"},
            "total_cents": {"type": "integer", "minimum": 0},
        },
    },
}
HANDLERS = """\
async def order_placed_v1(conn, request):
    return None
"""


def _write_team(team: Path) -> None:
    (team / "topologies").mkdir(parents=True)
    (team / "topologies/orders.yaml").write_text(yaml.safe_dump(TOPOLOGY, sort_keys=False))
    manifests = team / "manifests/orders"
    manifests.mkdir(parents=True)
    shop = {"context": "shop", "publishes": [ORDER_PLACED]}
    billing = {
        "context": "billing",
        "handles": [
            {"producer": "shop", "type": "order_placed", "version": 1,
             "handler": "orders_handlers:order_placed_v1"}
        ],
    }  # fmt: skip
    (manifests / "shop.yaml").write_text(yaml.safe_dump(shop, sort_keys=False))
    (manifests / "billing.yaml").write_text(yaml.safe_dump(billing, sort_keys=False))
    (team / "orders_handlers.py").write_text(HANDLERS)


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A team's directory (topology, manifests, handler module), its module importable."""
    root = tmp_path / "team"
    _write_team(root)
    monkeypatch.syspath_prepend(str(root))
    previous = use_registry(None)
    yield root
    use_registry(previous)


def _layout(team: Path) -> Layout:
    return Layout.of(team / "manifests", team / "registry.json")


def _ferry(
    args: list[str], cwd: Path, team: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``ferry`` in a fresh process, run from ``cwd``, with only the given FERRY_* settings."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    path = [str(ROOT)] + ([str(team)] if team else [])
    environ.update(PYTHONPATH=os.pathsep.join(path), **env)
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args], cwd=cwd, env=environ,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# --- generating, checking and loading a team's registry -------------------------------------


def test_ferry_generates_checks_and_lints_a_teams_registry_from_another_directory(
    team: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    registry = team / "registry.json"
    manifests = str(team / "manifests")
    made = _ferry(
        ["registry", "generate", "--manifests", manifests, "--out", str(registry)], elsewhere, team
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [
        "locked orders/shop/order_placed.v1",
        "wrote manifests/schemas.lock",
        "wrote registry.json",
    ]
    assert not (elsewhere / "manifests").exists() and not (elsewhere / "registry.json").exists()
    doc = json.loads(registry.read_text())
    [event] = doc["topologies"]["orders"]
    assert (event["producer"], event["type"], event["version"]) == ("shop", "order_placed", 1)
    assert event["manifest"] == "manifests/orders/shop.yaml"
    assert event["handlers"][0]["handler"] == "orders_handlers:order_placed_v1"
    assert "mediation" not in doc["topologies"]

    checked = _ferry(["registry", "check", "--manifests", manifests], elsewhere, team,
                     FERRY_REGISTRY=str(registry))  # fmt: skip
    assert (checked.returncode, checked.stdout) == (0, "registry, lock and topologies clean\n")

    topology = str(team / "topologies/orders.yaml")
    linted = _ferry(["lint"], elsewhere, FERRY_TOPOLOGY=topology, FERRY_REGISTRY=str(registry))
    assert (linted.returncode, linted.stdout) == (0, f"{topology}: clean\n"), linted.stderr
    # Without FERRY_REGISTRY the shipped registry has no events of this topology.
    bare = _ferry(["lint"], elsewhere, FERRY_TOPOLOGY=topology)
    assert bare.returncode == 1
    assert "no events are declared for topology 'orders'" in bare.stdout


def test_ferry_runs_from_any_directory_on_ferrys_own_files(tmp_path: Path) -> None:
    """No FERRY_TOPOLOGY, no --root: Ferry's topology, manifests, lock and registry are
    found from its installation, not from the working directory."""
    assert _ferry(["registry", "check"], tmp_path).stdout == "registry, lock and topologies clean\n"
    linted = _ferry(["lint"], tmp_path)
    assert (linted.returncode, linted.stdout) == (
        0,
        f"{ROOT / 'topologies/sea-vibespro.yaml'}: clean\n",
    )


def test_a_role_started_elsewhere_loads_the_teams_topology_and_registry(
    team: Path, tmp_path: Path
) -> None:
    """The dlq-router run from an unrelated directory refuses a lint finding of the team's
    topology (so it read both files the settings name), and a damaged registry file."""
    generate(_layout(team))
    doc = json.loads(json.dumps(TOPOLOGY))
    doc["contexts"]["billing"]["inbox_retention"] = "1d"
    path = team / "topologies/orders.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    environ.update(
        PYTHONPATH=str(ROOT), FERRY_TOPOLOGY=str(path), FERRY_REGISTRY=str(team / "registry.json")
    )

    def router() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.dlq_router"], cwd=elsewhere, env=environ,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    refused = router()
    assert refused.returncode == 2, refused.stderr
    assert f"{path}: contexts.billing.inbox_retention: 1d is shorter" in refused.stderr
    (team / "registry.json").write_text('{"format": "ferry-registry", "format_version": 7}')
    damaged = router()
    assert damaged.returncode == 2
    assert (
        f"{team / 'registry.json'}: format_version 7 was written by a newer Ferry; this one "
        "reads format_version 1"
    ) in damaged.stderr
    assert "Traceback" not in damaged.stderr


def test_a_missing_registry_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    result = _ferry(["lint"], tmp_path, FERRY_REGISTRY=str(missing))
    assert result.returncode == 2
    assert result.stderr == (
        f"ferry: configuration error: {missing}: cannot read the registry file: "
        "No such file or directory\n"
    )


def test_the_producer_accepts_the_teams_events_only_under_its_registry(team: Path) -> None:
    generate(_layout(team))
    order = {"order_id": "o-1", "total_cents": 1250}
    with pytest.raises(OutboxValidationError, match="UNDECLARED_EVENT"):
        check_outgoing("order_placed", 1, order, context="shop")
    use_registry(team / "registry.json")
    check_outgoing("order_placed", 1, order, context="shop")
    with pytest.raises(OutboxValidationError) as refused:
        check_outgoing("order_placed", 1, {"order_id": "o-1", "total_cents": -1})
    assert str(refused.value) == (
        "SCHEMA_INVALID: payload: order_placed.v1 of context shop: payload.total_cents: -1 is "
        "less than the minimum of 0"
    )
    with pytest.raises(OutboxValidationError, match="UNDECLARED_EVENT"):
        check_outgoing("vibe_created", 1, {"vibe_id": "v", "title": "t"})


@pytest.mark.integration
async def test_record_event_writes_a_team_event_under_ferry_registry(
    team: Path, pg_server: Any
) -> None:
    generate(_layout(team))
    dsn = pg_server.dsn(f"shop_{uuid.uuid4().hex[:8]}")
    await migrate_database(dsn, create=True)
    use_registry(team / "registry.json")
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn, aggregate_type="order", aggregate_id="o-1", event_type="order_placed",
                payload={"order_id": "o-1", "total_cents": 1250}, context="shop",
            )  # fmt: skip
        row = await conn.fetchrow(
            "SELECT event_type, event_version FROM outbox_events WHERE id = $1", event_id
        )
    finally:
        await conn.close()
    assert (row["event_type"], row["event_version"]) == ("order_placed", 1)


# --- the lock and the gates on a file registry ---------------------------------------------


def _edit(path: Path, change: Any) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_locked_version_of_a_teams_registry_cannot_change(team: Path) -> None:
    layout = _layout(team)
    generate(layout)
    before = {p: p.read_bytes() for p in (layout.lock, layout.registry)}
    _edit(
        team / "manifests/orders/shop.yaml",
        lambda d: d["publishes"][0]["schema"]["required"].append("currency"),
    )
    with pytest.raises(ConfigurationError) as refused:
        generate(layout)
    assert str(refused.value).startswith(
        "refusing to generate: manifests/orders/shop.yaml: publishes.order_placed.v1.schema: "
        "order_placed v1 of context shop is locked at sha256:"
    )
    assert "declare the change as order_placed.v2 [immutable-version]" in str(refused.value)
    assert {p: p.read_bytes() for p in before} == before
    assert "immutable-version" in {p.rule for p in check(layout)}


def test_the_coverage_gates_hold_on_a_teams_registry(team: Path) -> None:
    layout = _layout(team)

    def publish_refund(doc: dict[str, Any]) -> None:
        doc["publishes"].append({**ORDER_PLACED, "type": "order_refunded"})

    _edit(team / "manifests/orders/shop.yaml", publish_refund)
    generate(layout)
    problems = [str(p) for p in check(layout)]
    assert (
        "manifests/orders/shop.yaml: publishes.order_refunded.v1: context shop publishes "
        "order_refunded v1, but no context handles it: its messages would reach no handler "
        "[unhandled-event]"
    ) in problems
    assert {p.rule for p in check(layout)} == {"unhandled-event", "unexpected-delivery"}
    topology = load_topology(team / "topologies/orders.yaml", registry=layout.registry)
    assert [e.name for e in topology.events] == ["order_placed.v1", "order_refunded.v1"]


def test_a_stale_team_registry_is_found(team: Path) -> None:
    layout = _layout(team)
    generate(layout)
    _edit(team / "manifests/orders/shop.yaml", lambda d: d["publishes"][0].update(description="x"))
    [stale] = [str(p) for p in check(layout)]
    assert stale.startswith("registry.json: (file): differs from what the manifests generate")
    layout.registry.unlink()
    assert [str(p) for p in check(layout)] == [
        "registry.json: (file): is missing: run `ferry registry generate` and commit the result "
        "[stale-registry]"
    ]


# --- damaged files ------------------------------------------------------------------------


def _shipped() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "shared/contracts/registry.json").read_text())
    return doc


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("lock"), "f.json: lock: Field required"),
        (lambda d: d.update(format="ferry-topology"),
         "f.json: not a registry file: format is 'ferry-topology', expected 'ferry-registry'"),
        (lambda d: d.update(format_version="1"),
         "f.json: format_version must be an integer, got '1'"),
        (lambda d: d.update(format_version=0),
         "f.json: format_version 0 was written by an older Ferry; this one reads "
         "format_version 1"),
        (lambda d: d["topologies"]["mediation"][1].update(version="1"),
         "f.json: topologies.mediation[1](opportunity_archived).version: Input should be a "
         "valid integer"),
        (lambda d: d["topologies"]["mediation"][0].update(colour="red"),
         "f.json: topologies.mediation[0](opportunity_scored.v1).colour: Extra inputs are not "
         "permitted"),
        (lambda d: d["topologies"]["mediation"][0]["schema"].update(type="array"),
         "f.json: topologies.mediation[0](opportunity_scored.v1): invalid schema: schema: a "
         "payload is a JSON object: the schema needs type: object"),
        (lambda d: d["lock"].pop("mediation/module_e/opportunity_scored.v1"),
         "f.json: topologies.mediation[0](opportunity_scored.v1): "
         "mediation/module_e/opportunity_scored.v1 is missing from the file's lock: regenerate "
         "the file"),
        (lambda d: d["topologies"]["mediation"].append(d["topologies"]["mediation"][0]),
         "f.json: topologies.mediation[5](opportunity_scored.v1): declared twice by module_e"),
    ],
)  # fmt: skip
def test_a_damaged_registry_file_says_what_is_wrong(change: Any, message: str) -> None:
    doc = _shipped()
    change(doc)
    with pytest.raises(ConfigurationError) as refused:
        parse_registry(json.dumps(doc).encode(), "f.json")
    assert str(refused.value).startswith(message)


def test_not_json_is_named_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"format": "ferry-registry",\n  "format_version": 1,,}')
    with pytest.raises(ConfigurationError) as refused:
        read_registry(path)
    assert str(refused.value) == (
        f"{path}: not a registry file: not valid JSON (Expecting property name enclosed in "
        "double quotes at line 2, column 23)"
    )


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (dict keys and list indexes)."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


SHIPPED_PATHS = _paths(_shipped())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(SHIPPED_PATHS), value=_json(), drop=st.booleans())
def test_any_damage_to_a_registry_file_is_a_configuration_error(
    where: tuple[Any, ...], value: Any, drop: bool
) -> None:
    doc = _shipped()
    if not where:
        doc = value
    else:
        parent = doc
        for part in where[:-1]:
            parent = parent[part]
        if drop and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = value
    _parses_or_refuses(json.dumps(doc).encode())


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_are_a_registry_or_a_configuration_error(data: bytes) -> None:
    _parses_or_refuses(data)


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0), flip=st.integers(min_value=0, max_value=255))
def test_a_truncated_or_bit_flipped_registry_file_is_refused_cleanly(cut: int, flip: int) -> None:
    data = bytearray((ROOT / "shared/contracts/registry.json").read_bytes())
    index = cut % len(data)
    damaged = (
        bytes(data[:index]) if flip % 2 else bytes(data[:index] + bytes([flip]) + data[index + 1 :])
    )
    _parses_or_refuses(damaged)


def _parses_or_refuses(data: bytes) -> None:
    try:
        registry = parse_registry(data, "damaged.json")
    except ConfigurationError as exc:
        assert str(exc).startswith("damaged.json: ")
    else:
        assert registry.source == "damaged.json"


def test_deep_nesting_is_refused_cleanly() -> None:
    deep = b'{"format": "ferry-registry", "format_version": 1, "lock": ' + b"[" * 100_000
    with pytest.raises(ConfigurationError, match=r"^deep\.json: not a registry file"):
        parse_registry(deep, "deep.json")
