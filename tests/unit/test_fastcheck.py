"""The fast payload check agrees with jsonschema, and stays out of what it cannot judge.

:func:`compile_check` turns a schema of a common subset of draft 2020-12 into a predicate
that ``payload_error`` and ``check_outgoing`` trust for a "valid" answer. A predicate that
said "valid" where jsonschema says "invalid" would let a bad payload through to a
handler, so the properties generate schemas of the subset and JSON payloads aimed at
them (booleans next to 0 and 1, 1.0 next to 1, astral characters in lengths, nested
objects and arrays) and require the very same verdict as ``Draft202012Validator``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from shared.contracts.events import (
    AcceptedEvents,
    active_registry,
    payload_problems,
    summarize,
)
from shared.contracts.fastcheck import DIALECT, compile_check

PROPERTY = settings(max_examples=600, deadline=None)

#: Few names, so generated payloads hit the generated properties (and miss them).
NAMES = st.sampled_from(["a", "b", "ß", "😀", "type"])
TYPES = st.sampled_from(["null", "boolean", "object", "array", "number", "string", "integer"])
NUMBERS = st.one_of(
    st.sampled_from([0, 1, -1, 0.0, 1.0, -0.0, 1.5, 2, 2.0, 10**20, 1e20, 1e308, -1e-300]),
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False, allow_infinity=False),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)
TEXTS = st.one_of(
    st.sampled_from(["", "a", "ab", "😀", "😀😀", "ß", "a1", "A", "\n", "é"]),
    st.text(max_size=6),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXTS)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(NAMES, TEXTS), inner, max_size=4)
    ),
    max_leaves=12,
)
COUNTS = st.one_of(st.integers(0, 4), st.sampled_from([1.0, 2.0]))
BOUNDS = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 1.0, -0.0, 10**20, 1e20]))
PATTERNS = st.sampled_from(["^a", "b$", "[0-9]", "^.{2}$", "😀", "^$", "ß|a"])


def _keywords(sub: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=3, unique=True)),
            "enum": st.lists(JSON, min_size=1, max_size=4),
            "const": JSON,
            "minLength": COUNTS,
            "maxLength": COUNTS,
            "pattern": PATTERNS,
            "minimum": BOUNDS,
            "maximum": BOUNDS,
            "exclusiveMinimum": BOUNDS,
            "exclusiveMaximum": BOUNDS,
            "minItems": COUNTS,
            "maxItems": COUNTS,
            "items": sub,
            "properties": st.dictionaries(NAMES, sub, max_size=3),
            "required": st.lists(NAMES, max_size=3, unique=True),
            "additionalProperties": sub,
            "format": st.sampled_from(["uuid", "date-time", "email", "ipv4"]),
            "description": st.text(max_size=5),
            "title": st.text(max_size=5),
        },
    )


SCHEMAS = st.recursive(
    st.one_of(st.booleans(), _keywords(st.booleans())),
    _keywords,
    max_leaves=8,
)


def _payloads_for(schema: Any) -> st.SearchStrategy[Any]:
    """JSON values, plus objects built from the schema's own property names."""
    names = list(schema.get("properties", {})) if isinstance(schema, dict) else []
    names += schema.get("required", []) if isinstance(schema, dict) else []
    if not names:
        return JSON
    return st.one_of(JSON, st.dictionaries(st.sampled_from(names), JSON, max_size=len(names)))


@PROPERTY
@given(data=st.data(), schema=SCHEMAS)
def test_the_predicate_agrees_with_jsonschema(data: st.DataObject, schema: Any) -> None:
    check = compile_check(schema)
    assert check is not None, schema
    jsonschema = Draft202012Validator(schema)
    for _ in range(4):
        payload = data.draw(_payloads_for(schema))
        assert check(payload) == jsonschema.is_valid(payload), (schema, payload)


@pytest.mark.parametrize(
    ("schema", "payload", "valid"),
    [
        ({"type": "integer"}, True, False),
        ({"type": "integer"}, 1.0, True),
        ({"type": "integer"}, 1.5, False),
        ({"type": "number"}, False, False),
        ({"type": ["boolean", "string"]}, 0, False),
        ({"enum": [1]}, True, False),
        ({"enum": [1]}, 1.0, True),
        ({"const": [0]}, [False], False),
        ({"const": {"a": 1}}, {"a": 1.0}, True),
        ({"minimum": 1}, True, True),  # not a number: minimum does not apply
        ({"maxLength": 1}, "😀", True),  # one code point
        ({"minLength": 2}, "😀", False),
        ({"format": "uuid", "type": "string"}, "not a uuid", True),  # formats are annotations
        ({"additionalProperties": False, "properties": {"a": True}}, {"a": 1, "b": 2}, False),
        ({"items": {"type": "string"}}, ["a", 1], False),
        ({"pattern": "b"}, "abc", True),  # search, not match
    ],
)
def test_edge_cases(schema: dict[str, Any], payload: Any, valid: bool) -> None:
    check = compile_check(schema)
    assert check is not None
    assert Draft202012Validator(schema).is_valid(payload) is valid
    assert check(payload) is valid


OUTSIDE = [
    {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
    {"allOf": [{"type": "string"}]},
    {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"oneOf": [{"type": "string"}]},
    {"not": {"type": "string"}},
    {"prefixItems": [{"type": "string"}]},
    {"unevaluatedProperties": False},
    {"if": {"type": "string"}, "then": {"minLength": 1}},
    {"dependentRequired": {"a": ["b"]}},
    {"patternProperties": {"^a": {"type": "string"}}},
    {"multipleOf": 2},
    {"uniqueItems": True},
    {"x-vendor": 1},
    {"type": "strange"},
    {"pattern": "("},
    {"minLength": "2"},
    {"$schema": "http://json-schema.org/draft-07/schema#"},
    {"properties": {"a": {"type": "object", "properties": {"b": {"anyOf": [True]}}}}},
    {"items": [{"type": "string"}]},
]


@pytest.mark.parametrize("schema", OUTSIDE)
def test_schemas_outside_the_subset_fall_back(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None


@PROPERTY
@given(data=st.data(), schema=SCHEMAS)
@example(data=None, schema={"type": "object", "required": ["a"], "properties": {"a": False}})
def test_payload_error_says_what_jsonschema_says(data: Any, schema: Any) -> None:
    """The fast path changes no verdict and no wording (the error text is jsonschema's)."""
    accepted = AcceptedEvents({("e", 1): schema})
    validator = Draft202012Validator(schema)
    payloads = [{"a": 1}, {}] if data is None else [data.draw(_payloads_for(schema))]
    for payload in payloads:
        if validator.is_valid(payload):
            expected = None
        else:
            expected = f"e.v1: {summarize(payload_problems(validator, payload))}"
        assert accepted.payload_error(("e", 1), payload) == expected


def test_registry_schemas_compile() -> None:
    """Ferry's own payload schemas all take the fast path."""
    events = [event for _, event in active_registry().all_events()]
    assert events
    for event in events:
        assert compile_check(event.schema) is not None, (event.type, event.version)


def test_a_closed_object() -> None:
    schema = {
        "$schema": DIALECT,
        "type": "object",
        "properties": {"vibe_id": {"type": "string", "format": "uuid"}},
        "required": ["vibe_id"],
        "additionalProperties": False,
    }
    check = compile_check(schema)
    assert check is not None
    assert check({"vibe_id": "x"})
    assert not check({"vibe_id": "x", "other": 1})
    assert not check({"vibe_id": 1})
    assert not check({})
