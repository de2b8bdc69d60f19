"""``ferry asyncapi``: AsyncAPI 3.0 documents of the topologies, checked against the official
AsyncAPI 3.0 JSON Schema.

The schema comes from the AsyncAPI initiative's own npm package ``@asyncapi/specs`` (the
one its parser and CLI validate with), installed on first use under ``.var/`` with the
machine's npm at a pinned version; it is not copied into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator, Draft202012Validator

from shared.contracts.asyncapi import asyncapi_document
from shared.contracts.loading import load_topology
from shared.domain.envelope import Envelope
from tests.conftest import ROOT

#: The @asyncapi/specs release whose 3.0.0 schema the documents are checked against.
SPECS_VERSION = "6.11.1"
SPECS_DIR = ROOT / ".var" / "asyncapi-specs"
SCHEMA = SPECS_DIR / "node_modules/@asyncapi/specs/schemas/3.0.0-without-$id.json"
TOPOLOGIES = ["topologies/sea-vibespro.yaml", "topologies/mediation.yaml"]


def _installed_version() -> str | None:
    package = SPECS_DIR / "node_modules/@asyncapi/specs/package.json"
    if not package.exists():
        return None
    version: str = json.loads(package.read_text())["version"]
    return version


@pytest.fixture(scope="module")
def asyncapi_validator() -> Draft7Validator:
    """A validator of the official AsyncAPI 3.0.0 schema (draft-07), npm-installed once."""
    if _installed_version() != SPECS_VERSION or not SCHEMA.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install @asyncapi/specs (the AsyncAPI 3.0 schema)")
        SPECS_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix",
             str(SPECS_DIR), f"@asyncapi/specs@{SPECS_VERSION}"],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    schema = json.loads(SCHEMA.read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def _errors(validator: Draft7Validator, doc: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(doc)]


def _document(relative: str) -> dict[str, Any]:
    return asyncapi_document(load_topology(ROOT / relative), servers=["nats://127.0.0.1:4222"])


@pytest.mark.parametrize("relative", TOPOLOGIES)
def test_the_documents_of_the_shipped_topologies_are_valid_asyncapi_3(
    asyncapi_validator: Draft7Validator, relative: str
) -> None:
    assert _errors(asyncapi_validator, _document(relative)) == []


def test_the_official_schema_refuses_what_is_not_asyncapi_3(
    asyncapi_validator: Draft7Validator,
) -> None:
    """The check is not vacuous: the schema does look into operations and parameters."""
    doc = _document("topologies/mediation.yaml")
    next(iter(doc["operations"].values()))["action"] = "consume"
    assert _errors(asyncapi_validator, doc)
    doc = _document("topologies/mediation.yaml")
    next(c for c in doc["channels"].values() if "parameters" in c)["parameters"]["partition"][
        "enum"
    ] = [0, 1]
    assert _errors(asyncapi_validator, doc)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


@pytest.mark.parametrize("relative", TOPOLOGIES)
def test_every_reference_resolves_inside_the_document(relative: str) -> None:
    doc = _document(relative)
    refs = _refs(doc)
    assert refs
    for ref in refs:
        node: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        assert isinstance(node, dict), ref


def test_channels_operations_and_partitions_follow_the_topology() -> None:
    doc = _document("topologies/mediation.yaml")
    archived = doc["channels"]["mediation.f_to_g.archive.opportunity_archived.v1"]
    assert archived["address"] == "mediation.f_to_g.archive.opportunity_archived.v1.{partition}"
    assert archived["parameters"]["partition"]["enum"] == ["0", "1", "2", "3"]
    scored = doc["channels"]["mediation.e_to_f.events.opportunity_scored.v1"]
    assert scored["address"] == "mediation.e_to_f.events.opportunity_scored.v1"
    assert "parameters" not in scored
    receive = doc["operations"]["cg_g_archive.receive.opportunity_archived.v1"]
    assert receive["action"] == "receive"
    assert receive["channel"] == {
        "$ref": "#/channels/mediation.f_to_g.archive.opportunity_archived.v1"
    }
    assert receive["x-ferry"]["ordering"] == "key"
    assert receive["x-ferry"]["consumers"] == [f"cg_g_archive_p{k}" for k in range(4)]
    assert receive["x-ferry"]["handler"] == (
        "services.handlers.contexts.module_g:opportunity_archived_v1"
    )
    actions = {name: op["action"] for name, op in doc["operations"].items()}
    topology = load_topology(ROOT / "topologies/mediation.yaml")
    assert actions == {
        **{f"{e.context}.send.{e.name}": "send" for e in topology.events},
        **{f"{d}.receive.{e.name}": "receive" for e in topology.events for d in e.handled_by},
    }
    assert doc["servers"] == {
        "nats": {
            "host": "127.0.0.1:4222",
            "protocol": "nats",
            "description": "A NATS server with JetStream (FERRY_NATS_URL).",
        }
    }


def test_a_message_schema_takes_ferrys_envelope_and_the_payload_schema() -> None:
    doc = _document("topologies/sea-vibespro.yaml")
    message = doc["components"]["messages"]["vibespro.vibe_created.v2"]
    assert message["payload"]["schemaFormat"] == ("application/schema+json;version=draft-2020-12")
    validator = Draft202012Validator(message["payload"]["schema"])
    envelope = Envelope(
        message_id=str(uuid.uuid4()),
        subject="vibespro.event.vibe_created.v2",
        event_type="vibe_created",
        event_version=2,
        occurred_at=datetime.now(UTC),
        aggregate_type="vibe",
        aggregate_id="v-1",
        payload={"vibe_id": "v-1", "title": "t", "owner_id": "u-1"},
        context="vibespro",
    ).to_dict()
    assert list(validator.iter_errors(envelope)) == []
    envelope["payload"].pop("owner_id")
    assert [e.message for e in validator.iter_errors(envelope)] == [
        "'owner_id' is a required property"
    ]
    envelope["payload"]["owner_id"] = "u-1"
    envelope["event_version"] = 1
    assert not validator.is_valid(envelope)


def test_ferry_asyncapi_writes_a_teams_document_from_another_directory(
    asyncapi_validator: Draft7Validator, tmp_path: Path
) -> None:
    from .test_registry_file import _write_team

    team = tmp_path / "team"
    _write_team(team)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(team)]))

    def ferry(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shared.cli", *args], cwd=tmp_path,
            env={**environ, **env}, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    registry = team / "registry.json"
    made = ferry(
        "registry", "generate", "--manifests", str(team / "manifests"), "--out", str(registry)
    )
    assert made.returncode == 0, made.stderr
    out = tmp_path / "orders.asyncapi.json"
    written = ferry(
        "asyncapi", "--topology", str(team / "topologies/orders.yaml"), "--out", str(out),
        FERRY_REGISTRY=str(registry), FERRY_NATS_URL="nats://nats-a:4222,nats://nats-b:4222",
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    doc = json.loads(out.read_text())
    assert _errors(asyncapi_validator, doc) == []
    assert list(doc["channels"]) == ["shop.event.order_placed.v1"]
    assert sorted(doc["operations"]) == [
        "billing__from_shop.receive.order_placed.v1",
        "shop.send.order_placed.v1",
    ]
    assert {s["host"] for s in doc["servers"].values()} == {"nats-a:4222", "nats-b:4222"}
    payload = doc["components"]["schemas"]["shop.order_placed.v1.payload"]
    assert payload["properties"]["total_cents"] == {"type": "integer", "minimum": 0}
