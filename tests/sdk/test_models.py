"""Generated payload models: they type what the schema describes and accept every payload
the consumer's validator accepts (they never validate a second time with other rules)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from shared.domain.signing import verify
from shared.sdk.models import EventSchema, class_name, generate_models
from shared.sdk.request import parse_call
from shared.sdk.testing import handler_call, signed_headers

RICH: dict[str, Any] = {
    "type": "object",
    "required": ["id", "class", "kind"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "class": {"type": "string"},
        "_private": {"type": "integer"},
        "model_name": {"type": "string"},
        "schema": {"type": "string"},
        "kind": {"enum": ["a", "b", None]},
        "when": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "object", "additionalProperties": {"type": "number"}},
        "owner": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]}},
        },
        "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "anything": {"allOf": [{"type": "string"}]},
    },
}


def load(source: str, tmp_path: Path, name: str) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(name)
        return sys.modules[name]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    source = generate_models([EventSchema("thing_made", 3, RICH, "A thing.")], source="a test")
    assert source == generate_models(
        [EventSchema("thing_made", 3, RICH, "A thing.")], source="a test"
    ), "deterministic"
    return load(source, tmp_path_factory.mktemp("models"), "rich_payloads")


def test_names_and_shapes(rich: ModuleType) -> None:
    assert class_name("vibe_created", 2) == "VibeCreatedV2"
    model = rich.MODELS[("thing_made", 3)]
    assert model is rich.ThingMadeV3 and rich.SCHEMAS[("thing_made", 3)] == RICH
    thing = model.model_validate(
        {
            "id": "x",
            "class": "c",
            "_private": 1,
            "model_name": "m",
            "schema": "s",
            "kind": None,
            "when": "not a date: format is an annotation",
            "tags": ["t"],
            "scores": {"a": 1},
            "owner": {"name": "n", "age": None},
            "either": 3,
            "anything": "x",
        }
    )
    assert (thing.class_, thing.private, thing.model_name_, thing.schema_) == ("c", 1, "m", "s")
    assert thing.owner.name == "n" and thing.scores == {"a": 1.0} and thing.either == 3


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
candidates = st.fixed_dictionaries(
    {"id": st.text(max_size=5), "class": st.text(max_size=5), "kind": json_scalars},
    optional={
        "tags": st.lists(json_scalars, max_size=3),
        "owner": st.fixed_dictionaries({"name": json_scalars}, optional={"age": json_scalars}),
        "either": json_scalars,
        "scores": st.dictionaries(st.text(max_size=3), json_scalars, max_size=3),
        "_private": json_scalars,
    },
)


@given(candidates)
def test_the_model_accepts_whatever_the_schema_accepts(
    rich: ModuleType, doc: dict[str, Any]
) -> None:
    if Draft202012Validator(RICH).is_valid(doc):
        rich.ThingMadeV3.model_validate(doc)


def test_the_signing_client_builds_and_signs_what_the_consumer_sends() -> None:
    call = handler_call("thing_made", 3, {"id": "x"}, context="maker", attempt=2, durable="d")
    body = call.body()
    headers = {**call.headers(), **signed_headers(b"k", "d", body, now=1_000_000)}
    assert verify({"d": b"k"}, headers, body, now=1_000_010) == "d"
    parsed = parse_call(body, headers)
    assert parsed.message_id == call.message_id and parsed.delivery.attempt == 2
    assert parsed.envelope.subject == "maker.event.thing_made.v3"
    assert parsed.doc["retryCount"] == 1 and parsed.doc["messageId"] == call.message_id
    assert call.again().attempt == 3 and call.again().message_id == call.message_id
