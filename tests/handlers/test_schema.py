"""The JSON Schema subset validator and the fault directives, without any server."""

from __future__ import annotations

from typing import Any

import pytest

from services.handlers.faults import Faults, parse_faults
from services.handlers.schema import check_supported, validate
from shared.domain.errors import ConfigurationError, PoisonError

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "count"],
    "properties": {
        "id": {"type": "string"},
        "count": {"type": "integer"},
        "score": {"type": "number"},
        "flag": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "inner": {"type": "object", "required": ["x"], "properties": {"x": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "payload",
    [
        {"id": "a", "count": 1},
        {"id": "a", "count": 2.0, "score": 1, "flag": False, "note": None},
        {"id": "a", "count": 1, "score": 0.5, "inner": {"x": "y"}, "extra": [1]},
    ],
)
def test_accepts(payload: dict[str, Any]) -> None:
    validate(payload, SCHEMA)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"count": 1}, "payload.id: required field is missing"),
        ({"id": "a", "count": True}, "payload.count: expected integer, got boolean"),
        ({"id": "a", "count": 1.5}, "payload.count: expected integer, got number"),
        ({"id": "a", "count": 1, "score": "1"}, "payload.score: expected number, got string"),
        ({"id": "a", "count": 1, "flag": 0}, "payload.flag: expected boolean, got integer"),
        ({"id": "a", "count": 1, "note": 3}, "payload.note: expected string or null"),
        ({"id": "a", "count": 1, "inner": {}}, "payload.inner.x: required field is missing"),
        ([1], "payload: expected object, got array"),
    ],
)
def test_rejects_naming_the_field(payload: Any, message: str) -> None:
    with pytest.raises(PoisonError, match="SCHEMA_VIOLATION") as caught:
        validate(payload, SCHEMA)
    assert message in caught.value.detail


def test_supported_subset_passes_the_startup_check() -> None:
    check_supported({**SCHEMA, "title": "t", "$schema": "https://json-schema.org/draft/2020-12"})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "additionalProperties": False}, "additionalProperties"),
        ({"properties": {"a": {"enum": [1]}}}, "schema.properties.a: unsupported keyword"),
        ({"type": "decimal"}, "unknown type 'decimal'"),
        ({"required": "a"}, "must be a list of names"),
    ],
)
def test_unenforceable_schemas_are_refused(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_supported(schema)


def test_no_directive_means_no_fault() -> None:
    faults = parse_faults({"a": 1})
    assert faults == Faults()
    assert faults.forced(1) is None


def test_fail_attempts_stop_after_n() -> None:
    faults = parse_faults({"_ferry_test": {"fail_attempts": 2, "retry_after": 3}})
    assert [getattr(faults.forced(n), "status", None) for n in (1, 2, 3)] == [503, 503, None]
    forced = faults.forced(1)
    assert forced is not None and forced.headers == {"Retry-After": "3"}


def test_status_wins_over_fail_attempts() -> None:
    faults = parse_faults({"_ferry_test": {"status": 404, "fail_attempts": 1}})
    assert [getattr(faults.forced(n), "status", None) for n in (1, 2)] == [404, 404]


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("yes", "must be an object"),
        ({"poison": "true"}, "poison: must be true or false"),
        ({"status": 99}, "status: must be an HTTP status"),
        ({"status": True}, "status: must be an HTTP status"),
        ({"fail_attempts": -1}, "fail_attempts: must be a non-negative integer"),
        ({"slow_ms": 1.5}, "slow_ms: must be a non-negative integer"),
        ({"retry_after": "5"}, "retry_after: must be a non-negative number"),
    ],
)
def test_malformed_directives_are_poison(directive: Any, message: str) -> None:
    with pytest.raises(PoisonError, match="INVALID_TEST_DIRECTIVE") as caught:
        parse_faults({"_ferry_test": directive})
    assert message in caught.value.detail
