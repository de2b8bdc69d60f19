"""The envelope's fast paths answer exactly what the long way round answers.

Parsing takes shortcuts for what Ferry itself writes: a canonical UUID is kept as it is,
a ``format_timestamp`` text is read directly, a subject already seen is not parsed again,
a ``POST /handle`` body is not walked a second time, an idempotency key spelled like the
message id is not turned into UUIDs. Each shortcut must give the very answer (value or
poison) the general path gives for every other spelling.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain import json_text as json_text_module
from shared.domain.envelope import (
    Envelope,
    format_timestamp,
    json_defect,
    parse_json_body,
    parse_timestamp,
    payload_digest,
)
from shared.domain.errors import MalformedInput, PoisonError
from shared.domain.handler_call import request_body
from shared.sdk.request import MalformedRequest, parse_call
from tests.unit.hostile_values import clean_json, hostile_json, nested

PROPERTY = settings(max_examples=200, deadline=None)
MOMENTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


def _doc(**changes: Any) -> dict[str, Any]:
    payload = {"vibe_id": "v1", "title": "t"}
    doc: dict[str, Any] = {
        "message_id": str(uuid.uuid4()),
        "subject": "sea.vibespro.vibe_created.v1",
        "event_type": "vibe_created",
        "event_version": 1,
        "occurred_at": "2026-11-26T10:00:00.000000Z",
        "aggregate_type": "vibe",
        "aggregate_id": "a1",
        "payload": payload,
        "payload_digest": payload_digest(payload),
    }
    doc.update(changes)
    return doc


@PROPERTY
@given(moment=MOMENTS)
def test_a_canonical_time_reads_as_its_other_spellings(moment: datetime) -> None:
    text = format_timestamp(moment)
    parsed = parse_timestamp(text)
    assert parsed == moment
    assert parsed.tzinfo == UTC
    assert parse_timestamp(text[:-1] + "+00:00") == parsed
    assert parse_timestamp(text.replace("T", " ")) == parsed
    shifted = moment.astimezone(timezone(timedelta(hours=2))).isoformat()
    assert parse_timestamp(shifted) == parsed


@pytest.mark.parametrize(
    "text",
    ["2026-02-30T00:00:00.000000Z", "2026-01-01T24:00:00.000000Z", "0000-01-01T00:00:00.000000Z"],
)
def test_an_impossible_canonical_time_is_refused_in_words(text: str) -> None:
    with pytest.raises(MalformedInput, match=repr(text)):
        parse_timestamp(text)


@PROPERTY
@given(value=st.uuids(), spelling=st.sampled_from(["lower", "upper", "braces", "urn", "hex"]))
def test_message_ids_come_out_canonical(value: uuid.UUID, spelling: str) -> None:
    text = {
        "lower": str(value),
        "upper": str(value).upper(),
        "braces": "{" + str(value) + "}",
        "urn": value.urn,
        "hex": value.hex,
    }[spelling]
    envelope = Envelope.from_dict(_doc(message_id=text, correlation_id=text))
    assert envelope.message_id == str(value)
    assert envelope.correlation_id == str(value)


@pytest.mark.parametrize("text", ["not-a-uuid", "0" * 36, "g" * 8 + "-0000-0000-0000-" + "0" * 12])
def test_a_non_uuid_is_still_poison(text: str) -> None:
    with pytest.raises(PoisonError) as caught:
        Envelope.from_dict(_doc(message_id=text))
    assert caught.value.reason_code == "INVALID_FIELD"


def test_a_subject_seen_before_is_checked_again() -> None:
    """The parsed-subject memo never lets a disagreeing envelope through."""
    Envelope.from_dict(_doc())
    with pytest.raises(PoisonError) as caught:
        Envelope.from_dict(_doc(event_type="vibe_deleted"))
    assert caught.value.reason_code == "SUBJECT_MISMATCH"
    for _ in range(2):
        with pytest.raises(PoisonError) as caught:
            Envelope.from_dict(_doc(subject="sea..vibe_created.v1"))
        assert caught.value.reason_code == "INVALID_SUBJECT"


def test_a_byte_order_mark_is_refused_as_before() -> None:
    with pytest.raises(PoisonError) as caught:
        parse_json_body("\ufeff{}".encode())
    assert caught.value.detail == (
        "body is not JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)"
    )


def _body(doc: dict[str, Any]) -> bytes:
    envelope = Envelope.from_dict(doc)
    body = request_body(envelope, attempt=1, max_attempts=3, stream_sequence=7, durable="d")
    return json.dumps(body).encode()


def test_a_call_keyed_in_another_spelling_is_the_same_call() -> None:
    doc = _doc()
    body = _body(doc)
    upper = doc["message_id"].upper()
    assert parse_call(body, {"Idempotency-Key": upper}).message_id == doc["message_id"]
    with pytest.raises(MalformedRequest) as caught:
        parse_call(body, {"Idempotency-Key": str(uuid.uuid4())})
    assert caught.value.reason_code == "IDEMPOTENCY_KEY_MISMATCH"


def test_a_call_body_with_a_lone_surrogate_is_refused() -> None:
    """The body is walked once (by the decoder), not twice, and still refused."""
    doc = json.loads(_body(_doc()))
    doc["payload"]["title"] = "\ud800"
    body = json.dumps(doc).encode()  # ASCII escapes: the surrogate travels as \\ud800
    assert b"\\ud800" in body
    with pytest.raises(MalformedRequest) as caught:
        parse_call(body, {"Idempotency-Key": doc["message_id"]})
    assert caught.value.reason_code == "MALFORMED_JSON"
    assert "lone surrogate" in caught.value.detail


def test_created_at_is_the_occurred_at_text() -> None:
    envelope = Envelope.from_dict(_doc())
    body = request_body(envelope, attempt=2, max_attempts=3, stream_sequence=7, durable="d")
    assert body["createdAt"] == body["occurred_at"] == "2026-11-26T10:00:00.000000Z"


def _walked(
    value: Any, *, max_depth: int, forbid_nul: bool, check_text: bool, where: str = "payload"
) -> str | None:
    """json_defect the long way round: the walk alone, no look at the JSON text first
    and no level-by-level count of the nesting."""
    return json_text_module._walk(value, where, max_depth, forbid_nul, check_text)


@PROPERTY
@given(
    value=st.one_of(hostile_json, clean_json, st.integers(1, 8).map(nested)),
    max_depth=st.integers(1, 6),
    forbid_nul=st.booleans(),
    check_text=st.booleans(),
)
def test_json_defect_answers_as_the_walk(
    value: Any, max_depth: int, forbid_nul: bool, check_text: bool
) -> None:
    options = {"max_depth": max_depth, "forbid_nul": forbid_nul, "check_text": check_text}
    assert json_defect(value, **options) == _walked(value, **options)


@pytest.mark.parametrize(
    "value",
    [
        {"a": "x\x00"},
        {"x\x00": 1},
        {"a": ["\ud800"]},
        {"\udfff": 1},
        {"a": "\\u0000 is text, not NUL"},
        {"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["},
        nested(66),
        {"big": 10**5000},
        {"nan": float("nan")},
        {"set": {1, 2}},
    ],
)
def test_json_defect_answers_as_the_walk_for_hostile_documents(value: Any) -> None:
    for forbid_nul in (False, True):
        options = {"max_depth": 65, "forbid_nul": forbid_nul, "check_text": True}
        assert json_defect(value, **options) == _walked(value, **options)


def _body_the_long_way(data: bytes, max_depth: int) -> Any:
    """What :func:`parse_json_body` must answer: the document, or the walk's defect."""
    try:
        doc = json.loads(data)
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise PoisonError("MALFORMED_JSON", f"body is not JSON: {exc}") from None
    defect = _walked(doc, where="body", max_depth=max_depth, forbid_nul=False, check_text=True)
    if defect is not None:
        raise PoisonError("MALFORMED_JSON", defect)
    return doc


@PROPERTY
@given(
    value=st.one_of(
        hostile_json,
        clean_json,
        st.integers(1, 8).map(nested),
        st.lists(clean_json, min_size=2, max_size=6),  # many brackets, shallow (a batch)
    ),
    max_depth=st.integers(1, 8),
    ascii_only=st.booleans(),
)
def test_a_body_is_judged_as_the_long_way_round(
    value: Any, max_depth: int, ascii_only: bool
) -> None:
    try:
        text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=False)
    except (ValueError, TypeError):
        return  # no JSON text to send
    data = text.encode("utf-8", errors="surrogatepass")
    if not ascii_only and data != text.encode("utf-8", errors="replace"):
        return  # a lone surrogate has no UTF-8 form: only its escape travels
    try:
        expected = _body_the_long_way(data, max_depth)
    except PoisonError as exc:
        with pytest.raises(PoisonError) as raised:
            parse_json_body(data, max_depth=max_depth)
        if not exc.detail.startswith("body is not JSON"):
            assert raised.value.detail == exc.detail
        return
    assert parse_json_body(data, max_depth=max_depth) == expected
