"""The producer's checks (no database: :func:`event_statement` only builds the statement).

Whatever a caller passes, it gets the event's id and statement or an
:class:`OutboxValidationError`; what it accepts is storable by PostgreSQL (no NUL, no
lone surrogate, not nested past what a consumer accepts) and fits the wire: the payload
limit counts the UTF-8 bytes the payload takes in the envelope, not characters.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.adapters.postgres import Statement
from shared.adapters.producer import MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, event_statement
from shared.domain.envelope import MAX_PAYLOAD_DEPTH
from shared.domain.errors import OutboxValidationError
from tests.unit.hostile_values import clean_json, clean_text, hostile_json, hostile_text, nested

PROPERTY = settings(max_examples=200, deadline=None)
CHANGE = Statement("UPDATE models SET name = $1", ("x",))
#: Bytes of {"model_id":"m1","name":""}: the payload around the name.
FRAME = len(b'{"model_id":"m1","name":""}')


def _event(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "aggregate_type": "model",
        "aggregate_id": "m1",
        "event_type": "model_published",
        "payload": {"model_id": "m1", "name": "first"},
    }
    fields.update(changes)
    return fields


def _payload_arg(statement: Statement) -> str:
    text = statement.args[len(CHANGE.args) + 5]
    assert isinstance(text, str)
    return text


def _refusal(**changes: Any) -> OutboxValidationError:
    with pytest.raises(OutboxValidationError) as refused:
        event_statement(CHANGE, **_event(**changes))  # type: ignore[arg-type]
    return refused.value


@pytest.mark.parametrize(("char", "width"), [("Ж", 2), ("€", 3), ("😀", 4)])
def test_multibyte_payload_just_under_the_limit_is_accepted(char: str, width: int) -> None:
    name = char * ((MAX_PAYLOAD_BYTES - FRAME) // width)
    _, statement = event_statement(CHANGE, **_event(payload={"model_id": "m1", "name": name}))
    assert MAX_PAYLOAD_BYTES - width < len(_payload_arg(statement).encode()) <= MAX_PAYLOAD_BYTES


@pytest.mark.parametrize(("char", "width"), [("Ж", 2), ("€", 3), ("😀", 4)])
def test_multibyte_payload_just_over_the_limit_is_refused_naming_limit_and_size(
    char: str, width: int
) -> None:
    name = char * ((MAX_PAYLOAD_BYTES - FRAME) // width + 1)
    size = FRAME + len(name) * width
    assert len(name) + FRAME < MAX_PAYLOAD_BYTES < size  # characters fit, bytes do not
    refused = _refusal(payload={"model_id": "m1", "name": name})
    assert (refused.code, refused.field) == ("MESSAGE_TOO_LARGE", "payload")
    assert f"{size} bytes" in refused.reason
    assert f"limit of {MAX_PAYLOAD_BYTES} bytes" in refused.reason


@settings(max_examples=40, deadline=None)
@given(
    chars=st.lists(st.sampled_from(["a", "é", "Ж", "€", "😀"]), min_size=1, max_size=4),
    slack=st.integers(min_value=-8, max_value=8),
)
def test_the_limit_is_exactly_the_utf8_bytes_of_the_payload(chars: list[str], slack: int) -> None:
    unit = "".join(chars)
    width = len(unit.encode())
    base = unit * ((MAX_PAYLOAD_BYTES - FRAME) // width)  # at most the limit
    name = base + "a" * slack if slack >= 0 else base[:slack]
    size = FRAME + len(name.encode())
    try:
        _, statement = event_statement(CHANGE, **_event(payload={"model_id": "m1", "name": name}))
    except OutboxValidationError as exc:
        assert exc.code == "MESSAGE_TOO_LARGE" and size > MAX_PAYLOAD_BYTES
        assert f"{size} bytes" in exc.reason
    else:
        assert size <= MAX_PAYLOAD_BYTES and len(_payload_arg(statement).encode()) == size


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"model_id": "m1", "name": "a\x00b"}, "payload.name: text contains NUL"),
        ({"model_id": "m1", "name": "n", "x\x00": 1}, "key 'x\\x00': text contains NUL"),
        ({"model_id": "m1", "name": "\ud800"}, "payload.name: text is not valid Unicode"),
        ({"model_id": "m1", "name": "n", "deep": nested(MAX_PAYLOAD_DEPTH)}, "nested deeper"),
        ({"model_id": "m1", "name": "n", "deep": nested(5000)}, "nested deeper"),
        ({"model_id": "m1", "name": "n", "big": 10**5000}, "not JSON-serialisable"),
        ({"model_id": "m1", "name": "n", "nan": float("nan")}, "not JSON-serialisable"),
    ],
)
def test_payloads_postgres_or_a_consumer_cannot_take_are_refused_by_name(
    payload: dict[str, Any], named: str
) -> None:
    refused = _refusal(payload=payload)
    assert (refused.code, refused.field) == ("INVALID_OUTBOX", "payload")
    assert named in refused.reason


def test_the_deepest_payload_a_consumer_accepts_is_accepted() -> None:
    deep = nested(MAX_PAYLOAD_DEPTH - 1)
    event_statement(CHANGE, **_event(payload={"model_id": "m1", "name": "n", "deep": deep}))


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("aggregate_id", "m\x00", "INVALID_OUTBOX"),
        ("aggregate_type", "\udc80model", "INVALID_OUTBOX"),
        ("aggregate_id", "Ж" * (MAX_KEY_BYTES // 2 + 1), "MESSAGE_TOO_LARGE"),
    ],
)
def test_keys_postgres_cannot_store_or_too_large_for_the_envelope_are_refused(
    field: str, value: str, code: str
) -> None:
    refused = _refusal(**{field: value})
    assert (refused.code, refused.field) == (code, field)


@PROPERTY
@given(
    aggregate_type=st.one_of(hostile_text, st.just("model")),
    aggregate_id=st.one_of(hostile_text, st.integers(), st.none()),
    event_type=st.one_of(st.just("model_published"), hostile_text),
    event_version=st.one_of(st.just(1), st.integers(), st.booleans()),
    extra=st.dictionaries(hostile_text, hostile_json, max_size=3),
    event_id=st.one_of(st.none(), st.uuids(), hostile_text),
    correlation_id=st.one_of(st.none(), st.uuids(), hostile_text),
)
def test_any_event_gives_a_statement_or_the_projects_error(**fields: Any) -> None:
    extra = fields.pop("extra")
    payload = {"model_id": "m1", "name": "n", **extra}
    try:
        row_id, statement = event_statement(CHANGE, **fields, payload=payload)
    except OutboxValidationError as exc:
        assert exc.code in CODES and exc.field
        return
    assert isinstance(row_id, uuid.UUID)
    _assert_storable(_payload_arg(statement))


@PROPERTY
@given(extra=st.dictionaries(hostile_text, hostile_json, min_size=1, max_size=4))
def test_any_payload_gives_a_statement_or_the_projects_error(extra: dict[str, Any]) -> None:
    payload = {"model_id": "m1", "name": "n", **extra}
    try:
        _, statement = event_statement(CHANGE, **_event(payload=payload))
    except OutboxValidationError as exc:
        assert exc.code in CODES and exc.field == "payload"
        return
    _assert_storable(_payload_arg(statement))


@PROPERTY
@given(extra=st.dictionaries(clean_text, clean_json, max_size=5))
def test_any_clean_payload_the_schema_allows_is_accepted_as_it_will_be_read(
    extra: dict[str, Any],
) -> None:
    payload = {**extra, "model_id": "m1", "name": "n"}
    _, statement = event_statement(CHANGE, **_event(payload=payload))
    text = _payload_arg(statement)
    assert json.loads(text) == payload
    _assert_storable(text)


def _assert_storable(text: str) -> None:
    wire = text.encode()  # raises on a lone surrogate
    assert len(wire) <= MAX_PAYLOAD_BYTES
    assert not any("\x00" in piece for piece in _texts(json.loads(text)))


def _texts(value: Any) -> list[str]:
    """Every key and string in ``value``."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        return [t for key, item in value.items() for t in (key, *_texts(item))]
    return []


CODES = {
    "INVALID_OUTBOX",
    "INVALID_SUBJECT",
    "MESSAGE_TOO_LARGE",
    "UNDECLARED_EVENT",
    "SCHEMA_INVALID",
    "FUTURE_EVENT",
}
