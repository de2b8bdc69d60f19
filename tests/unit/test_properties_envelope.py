"""Envelope identification: any bytes a peer sends give an envelope or poison, nothing else.

``identify`` is what the inbox-consumer and the dlq-router run on every message; an
exception out of it is a crash loop. The properties feed it arbitrary bytes, arbitrary
JSON documents, a valid envelope with any field replaced by any JSON value or by a raw
hostile token (deep nesting, 5,000-digit numbers, NaN, escaped lone surrogates), and
check the round trips ``to_wire`` → ``from_wire`` and ``format_timestamp`` →
``parse_timestamp``. The examples first pin each crash the issue reported.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.envelope import (
    MAX_PAYLOAD_DEPTH,
    Envelope,
    Identified,
    format_timestamp,
    identify,
    parse_timestamp,
    payload_digest,
)
from shared.domain.errors import MalformedInput, PoisonError
from tests.unit.hostile_values import clean_json, clean_text, hostile_json, hostile_tokens, nested

PROPERTY = settings(max_examples=200, deadline=None)
POISON_CODES = {
    "MALFORMED_JSON",
    "MALFORMED_ENVELOPE",
    "MISSING_FIELD",
    "INVALID_FIELD",
    "INVALID_SUBJECT",
    "SUBJECT_MISMATCH",
    "DIGEST_MISMATCH",
}
SUBJECT = "vibespro.event.vibe_created.v1"
FIELDS = (
    "message_id",
    "subject",
    "context",
    "event_type",
    "event_version",
    "occurred_at",
    "correlation_id",
    "causation_id",
    "aggregate_type",
    "aggregate_id",
    "payload",
    "payload_digest",
    "payload.title",  # inside the payload: a field the digest and the handler both read
)


def _doc(**changes: Any) -> dict[str, Any]:
    payload = changes.pop("payload", {"vibe_id": "v1", "title": "t"})
    doc = {
        "message_id": "550e8400-e29b-41d4-a716-446655440000",
        "subject": SUBJECT,
        "context": "vibespro",
        "event_type": "vibe_created",
        "event_version": 1,
        "occurred_at": "2025-12-28T22:00:00.000000Z",
        "aggregate_type": "vibe",
        "aggregate_id": "v1",
        "payload": payload,
    }
    doc.update(changes)
    return doc


def _identify(data: bytes, subject: str = SUBJECT) -> Identified:
    return identify(data, subject=subject, msg_id_header=None, stream="VIBESPRO_EVENTS", seq=7)


def _poison_code(data: bytes, subject: str = SUBJECT) -> str:
    found = _identify(data, subject)
    assert found.envelope is None and found.poison is not None
    return found.poison.reason_code


# --- the crashes the issue reported, each now poison -------------------------------------


@pytest.mark.parametrize("depth", [MAX_PAYLOAD_DEPTH, 1000, 100_000])
def test_deep_nesting_is_poison_not_a_recursion_error(depth: int) -> None:
    # ``depth`` arrays inside the payload object: one level more than a payload may have.
    arrays = "[" * depth + "]" * depth
    in_payload = json.dumps(_doc()).replace('{"vibe_id"', '{"deep":' + arrays + ',"vibe_id"')
    assert _poison_code(in_payload.encode()) == "MALFORMED_JSON"
    assert _poison_code(("[" + arrays + "]").encode()) in ("MALFORMED_JSON", "MALFORMED_ENVELOPE")
    if depth > MAX_PAYLOAD_DEPTH:
        assert _poison_code(arrays.encode()) == "MALFORMED_JSON"


def test_the_deepest_payload_allowed_is_identified() -> None:
    payload = {"deep": nested(MAX_PAYLOAD_DEPTH - 1)}
    doc = _doc(payload=payload, payload_digest=payload_digest(payload))
    assert _identify(json.dumps(doc).encode()).envelope is not None


def test_a_number_past_pythons_digit_limit_is_poison() -> None:
    body = json.dumps(_doc()).replace('"title": "t"', '"title": ' + "9" * 5000)
    assert _poison_code(body.encode()) == "MALFORMED_JSON"


def test_a_huge_version_in_the_subject_is_poison() -> None:
    subject = "vibespro.event.vibe_created.v" + "9" * 5000
    body = json.dumps(_doc(subject=subject)).encode()
    assert _poison_code(body, subject) == "INVALID_SUBJECT"


@pytest.mark.parametrize(
    "changes",
    [
        {"payload": {"title": "\ud800"}},
        {"payload": {"title": "\ud800"}, "payload_digest": "sha256:00"},
        {"payload": {"\udfff": 1}},
        {"aggregate_id": "v\ud800"},
        {"context": "\udc80"},
    ],
)
def test_lone_surrogates_are_poison_not_a_unicode_error(changes: dict[str, Any]) -> None:
    # json.dumps escapes them (\ud800), as a peer's encoder would: valid bytes, bad text.
    body = json.dumps(_doc(**changes)).encode()
    assert _poison_code(body) == "MALFORMED_JSON"


def test_an_escaped_surrogate_pair_is_text_not_poison() -> None:
    payload = {"title": ["😀", {"k": "😀"}]}
    doc = _doc(payload=payload, payload_digest=payload_digest(payload))
    found = _identify(json.dumps(doc, ensure_ascii=True).encode())  # "\ud83d\ude00"
    assert found.envelope is not None and found.envelope.payload == payload


def test_poison_names_where_the_lone_surrogate_is() -> None:
    body = json.dumps(_doc(payload={"list": [1, {"k": "\udc00"}]})).encode()
    poison = _identify(body).poison
    assert poison is not None and "body.payload.list[1].k" in poison.detail


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400", "-2.5E+999"])
def test_nan_and_infinity_are_not_json(constant: str) -> None:
    # 1e400 is JSON, but Python reads it as inf and would write it on as "Infinity".
    body = json.dumps(_doc()).replace('"title": "t"', f'"title": {constant}')
    assert _poison_code(body.encode()) == "MALFORMED_JSON"


@pytest.mark.parametrize(
    "occurred_at",
    [
        "0001-01-01T00:00:00+01:00",  # UTC would be year 0: OverflowError in format_timestamp
        "9999-12-31T23:59:59-01:00",
        "2025-02-30T00:00:00Z",
        "2025-12-28T22:00:00",  # no zone
        "2025-12-28T22:00:00\x00Z",
        "2025-12-28",
        "٢٠٢٥-١٢-٢٨T22:00:00Z",  # other scripts' digits
    ],
)
def test_bad_timestamps_are_poison(occurred_at: str) -> None:
    body = json.dumps(_doc(occurred_at=occurred_at)).encode()
    assert _poison_code(body) == "INVALID_FIELD"


def test_a_non_string_context_is_refused_not_stringified() -> None:
    assert _poison_code(json.dumps(_doc(context={"a": 1})).encode()) == "INVALID_FIELD"


def test_a_body_in_utf16_is_not_json() -> None:
    assert _poison_code(json.dumps(_doc()).encode("utf-16")) == "MALFORMED_JSON"


def test_the_wire_is_utf8_not_ascii_escapes() -> None:
    payload = {"name": "Ж" * 1000}
    wire = Envelope.from_dict(_doc(payload=payload)).to_wire()
    assert ("Ж" * 1000).encode() in wire and b"\\u0416" not in wire
    assert len(wire) < 2000 + 600


def test_the_digest_is_over_utf8_text_as_before() -> None:
    # Digests already stored (rows, dead-letter records) were taken over UTF-8 text;
    # the wire form changing must not change them.
    assert (
        payload_digest({"name": "Ж"})
        == "sha256:" + __import__("hashlib").sha256('{"name":"Ж"}'.encode()).hexdigest()
    )


# --- properties ----------------------------------------------------------------------------


@PROPERTY
@given(data=st.binary(max_size=2000))
def test_any_bytes_give_an_envelope_or_poison(data: bytes) -> None:
    found = _identify(data)
    assert isinstance(found.message_id, uuid.UUID)
    assert (found.envelope is None) != (found.poison is None)


@PROPERTY
@given(doc=hostile_json, header=st.one_of(st.none(), st.text(max_size=40)))
def test_any_json_document_gives_an_envelope_or_poison(doc: Any, header: str | None) -> None:
    data = json.dumps(doc, ensure_ascii=True).encode()
    found = identify(data, subject=SUBJECT, msg_id_header=header, stream="S", seq=1)
    assert (found.envelope is None) != (found.poison is None)


@PROPERTY
@given(
    field=st.sampled_from(FIELDS),
    value=st.one_of(hostile_json, hostile_tokens.map(lambda t: _Raw(t))),
    nats_subject=st.sampled_from([SUBJECT, "ferry.replay.VIBESPRO_EVENTS.sea", "other.x.v1"]),
)
def test_a_valid_envelope_with_any_field_replaced_gives_an_envelope_or_poison(
    field: str, value: Any, nats_subject: str
) -> None:
    data = _with_field(_doc(), field, value)
    found = _identify(data, nats_subject)
    assert (found.envelope is None) != (found.poison is None)
    if found.envelope is not None:
        # Whatever was accepted can be sent on: to the handler, to a dead-letter record.
        assert Envelope.from_wire(found.envelope.to_wire()).to_dict() == found.envelope.to_dict()


@PROPERTY
@given(data=st.binary(max_size=500), subject=st.text(max_size=40))
def test_from_wire_raises_only_poison_with_a_known_code(data: bytes, subject: str) -> None:
    try:
        envelope = Envelope.from_wire(data, nats_subject=subject)
    except PoisonError as exc:
        assert exc.reason_code in POISON_CODES
    else:
        assert envelope.subject == subject


def _regex(pattern: str) -> st.SearchStrategy[str]:
    return st.from_regex(pattern, fullmatch=True)


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    namespace = draw(_regex(r"[a-z][a-z0-9_]{0,8}(\.[a-z][a-z0-9_]{0,8}){0,2}"))
    event_type = draw(_regex(r"[a-z][a-z0-9]{0,8}(_[a-z0-9]{1,8}){0,3}"))
    version = draw(st.integers(min_value=1, max_value=1000))
    payload = draw(st.dictionaries(clean_text, clean_json, max_size=5))
    optional_id = st.one_of(st.none(), st.uuids().map(str))
    return Envelope(
        message_id=str(draw(st.uuids())),
        subject=f"{namespace}.{event_type}.v{version}",
        event_type=event_type,
        event_version=version,
        occurred_at=draw(_moments),
        aggregate_type=draw(clean_text.filter(bool)),
        aggregate_id=draw(clean_text.filter(bool)),
        payload=payload,
        context=draw(clean_text),
        correlation_id=draw(optional_id),
        causation_id=draw(optional_id),
        payload_digest=payload_digest(payload),
    )


# Fixed offsets (as RFC 3339 writes them): a zone's DST fold makes Python's aware
# comparison say unequal for the same instant, which is no concern of the parser.
_offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
_moments = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=_offsets,
)


@PROPERTY
@given(envelope=envelopes())
def test_to_wire_then_from_wire_is_identity(envelope: Envelope) -> None:
    wire = envelope.to_wire()
    again = Envelope.from_wire(wire, nats_subject=envelope.subject)
    assert again.to_dict() == envelope.to_dict()
    assert again.to_wire() == wire
    found = _identify(wire, envelope.subject)
    assert found.envelope is not None and str(found.message_id) == envelope.message_id


@PROPERTY
@given(moment=_moments)
def test_format_then_parse_timestamp_is_identity(moment: datetime) -> None:
    text = format_timestamp(moment)
    parsed = parse_timestamp(text)
    assert parsed == moment and parsed.tzinfo is not None
    assert format_timestamp(parsed) == text


@PROPERTY
@given(text=st.text(max_size=40))
def test_parse_timestamp_of_any_text_gives_a_moment_or_malformed_input(text: str) -> None:
    try:
        moment = parse_timestamp(text)
    except MalformedInput:
        return
    assert moment.utcoffset() == timedelta(0)
    format_timestamp(moment)


_digits = st.integers(min_value=0, max_value=99).map(lambda n: f"{n:02d}")


@PROPERTY
@given(
    year=st.integers(min_value=0, max_value=9999).map(lambda n: f"{n:04d}"),
    month=_digits,
    day=_digits,
    clock=st.tuples(_digits, _digits, _digits).map(":".join),
    fraction=st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,9}", fullmatch=True)),
    zone=st.one_of(
        st.sampled_from(["Z", "z"]),
        st.tuples(st.sampled_from("+-"), _digits, _digits).map(lambda t: f"{t[0]}{t[1]}:{t[2]}"),
    ),
)
def test_parse_timestamp_of_rfc3339_shaped_text_gives_a_moment_or_malformed_input(
    year: str, month: str, day: str, clock: str, fraction: str, zone: str
) -> None:
    text = f"{year}-{month}-{day}T{clock}{fraction}{zone}"
    try:
        moment = parse_timestamp(text)
    except MalformedInput:
        return
    assert format_timestamp(moment).startswith(str(moment.year).zfill(4))


def test_fractions_past_microseconds_are_cut_and_offsets_honoured() -> None:
    moment = parse_timestamp("2025-12-28T23:00:00.123456789+01:00")
    assert moment == datetime(2025, 12, 28, 22, 0, 0, 123456, tzinfo=UTC)
    assert parse_timestamp("2025-12-28 22:00:00z") == datetime(2025, 12, 28, 22, tzinfo=UTC)
    assert moment.tzinfo == UTC


class _Raw:
    """A JSON text spliced into a document as it is (to carry what json.dumps cannot)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _with_field(doc: dict[str, Any], field: str, value: Any) -> bytes:
    marker = "\u0001MARK\u0001"
    placed = marker if isinstance(value, _Raw) else value
    if field.startswith("payload."):
        doc = {**doc, "payload": {**doc["payload"], field.removeprefix("payload."): placed}}
    else:
        doc = {**doc, field: placed}
    if not isinstance(value, _Raw):
        return json.dumps(doc, ensure_ascii=True).encode()
    text = json.dumps(doc, ensure_ascii=False)
    quoted = re.escape(json.dumps(marker, ensure_ascii=False))
    return re.sub(quoted, lambda _: value.text, text).encode()
