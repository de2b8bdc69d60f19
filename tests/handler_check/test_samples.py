"""Payloads built from schemas (shared/contracts/samples.py), met by hypothesis."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from shared.contracts.samples import (
    UNEXPECTED_PROPERTY,
    SampleError,
    poison_payload,
    sample_payload,
)
from shared.runtime.settings import CommonSettings
from tests.conftest import AUTH_TOPOLOGIES

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
FORMATS = st.sampled_from(["uuid", "date-time", "date", "email", "uri", "ipv4", "hostname"])


@st.composite
def integers(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": draw(st.sampled_from(["integer", "number"]))}
    low = draw(st.none() | st.integers(-1000, 1000))
    step = draw(st.none() | st.integers(1, 7))
    if low is not None:
        schema["minimum"] = low
    if draw(st.booleans()):
        base = 1 if low is None else low
        schema["maximum"] = base + draw(st.integers(step or 0, 500))
    if step is not None:
        schema["multipleOf"] = step
    return schema


@st.composite
def strings(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if draw(st.booleans()):
        schema["format"] = draw(FORMATS)
        return schema
    shortest = draw(st.integers(0, 40))
    schema["minLength"] = shortest
    if draw(st.booleans()):
        schema["maxLength"] = shortest + draw(st.integers(0, 20))
    return schema


LEAVES = (
    integers()
    | strings()
    | st.just({"type": "boolean"})
    | st.just({"type": ["string", "null"]})
    | st.lists(st.integers() | st.text(max_size=5), min_size=1, max_size=3).map(
        lambda values: {"enum": values}
    )
    | (st.integers() | st.text(max_size=5)).map(lambda value: {"const": value})
)


def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        properties = draw(st.dictionaries(NAMES, children, max_size=4))
        required = (
            draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
        )
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return build()


def arrays(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda items, least: {"type": "array", "items": items, "minItems": least},
        children,
        st.integers(0, 3),
    )


SCHEMAS = st.recursive(LEAVES, lambda kids: objects(kids) | arrays(kids), max_leaves=12)
PAYLOAD_SCHEMAS = objects(SCHEMAS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOAD_SCHEMAS)
def test_a_satisfiable_schema_gets_a_payload_it_accepts(schema: dict[str, Any]) -> None:
    payload = sample_payload(schema)
    assert isinstance(payload, dict)
    assert Draft202012Validator(schema).is_valid(payload)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOAD_SCHEMAS)
def test_poison_is_refused_or_there_is_none(schema: dict[str, Any]) -> None:
    valid = sample_payload(schema)
    poison = poison_payload(schema, valid)
    validator = Draft202012Validator(schema)
    if poison is None:
        # Only a schema that constrains nothing about its properties has no poison.
        assert not schema.get("required") and not schema.get("properties")
        assert schema.get("additionalProperties", True) is not False
    else:
        assert isinstance(poison, dict) and not validator.is_valid(poison)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(NAMES, st.integers() | st.text(max_size=3), max_size=3), SCHEMAS)
def test_any_schema_gives_a_valid_payload_or_a_sample_error(
    example: dict[str, Any], schema: dict[str, Any]
) -> None:
    # Odd roots (not objects, a pattern, a bad ref) fail with SampleError, never anything else.
    for candidate in (schema, {**schema, "pattern": "^[0-9]{3}$"}, {"$ref": "#/$defs/nope"}):
        try:
            payload = sample_payload(candidate)
        except SampleError:
            continue
        assert Draft202012Validator(candidate).is_valid(payload)
    # A valid example is taken as is.
    with_example = {"type": "object", "examples": [example]}
    assert sample_payload(with_example) == example


def test_refs_all_of_and_branches_are_followed() -> None:
    schema = {
        "$defs": {"id": {"type": "string", "format": "uuid"}},
        "type": "object",
        "required": ["id", "kind", "when", "n"],
        "properties": {
            "id": {"$ref": "#/$defs/id"},
            "kind": {"oneOf": [{"type": "integer", "maximum": -5}, {"type": "string"}]},
            "when": {"allOf": [{"type": "string"}, {"format": "date-time"}]},
            "n": {"type": "integer", "exclusiveMinimum": 10},
        },
    }
    payload = sample_payload(schema)
    uuid.UUID(payload["id"])
    assert payload["n"] == 11 and payload["kind"] == -5
    assert Draft202012Validator(schema).is_valid(payload)


def test_unsatisfiable_schemas_name_the_path() -> None:
    with pytest.raises(SampleError, match=r"payload\.code: .*pattern"):
        sample_payload(
            {
                "type": "object",
                "required": ["code"],
                "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}},
            }
        )
    with pytest.raises(SampleError, match=r"payload\.n: no number"):
        sample_payload(
            {
                "type": "object",
                "required": ["n"],
                "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 4}},
            }
        )
    # The pattern's example makes it buildable.
    schema = {
        "type": "object",
        "required": ["code"],
        "properties": {"code": {"type": "string", "pattern": "^[0-9]+$", "examples": ["42"]}},
    }
    assert sample_payload(schema) == {"code": "42"}


def test_poison_of_a_closed_object_adds_an_undeclared_property() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert poison_payload(schema, {}) == {UNEXPECTED_PROPERTY: True}
    assert poison_payload({"type": "object"}, {}) is None


@pytest.mark.parametrize("path", AUTH_TOPOLOGIES)
def test_every_shipped_event_gets_a_payload_and_a_poison(path: str) -> None:
    topology = CommonSettings(topology=path).load_topology()
    assert topology.events
    for event in topology.events:
        assert event.payload_schema is not None
        payload = sample_payload(event.payload_schema)
        validator = Draft202012Validator(event.payload_schema)
        assert validator.is_valid(payload), event.name
        poison = poison_payload(event.payload_schema, payload)
        assert poison is not None and not validator.is_valid(poison), event.name
        # Strings are fresh per call: a second run does not collide on a handler's keys.
        assert sample_payload(event.payload_schema) != payload or not any(
            isinstance(v, str) for v in payload.values()
        )
