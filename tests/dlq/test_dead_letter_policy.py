"""Pure policy of dead letters: record sizing (property-based), the sweep's horizon and its
test of whether JetStream may still deliver a message."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.adapters.dead_letters.records import (
    encode,
    fit,
    header_bytes,
    replay_body,
    stored_record,
)
from shared.contracts.loading import load_topology
from shared.domain.dead_letter import (
    DurableProgress,
    dead_letter_record,
    history_event,
    initial_status,
    is_failed_replay,
    may_still_be_delivered,
    redelivery_horizon,
    replay_delay,
)
from tests.conftest import ROOT

texts = st.text(alphabet=st.characters(exclude_categories=()), max_size=3000)  # surrogates too
payloads = st.recursive(
    st.none() | st.integers() | texts,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
histories = st.lists(
    st.fixed_dictionaries({"status": st.integers(100, 599), "detail": st.text(max_size=500)}),
    max_size=60,
)


def _record(payload: Any, history: list[dict[str, Any]], error: str) -> dict[str, Any]:
    return dead_letter_record(
        durable="sea__from_vibespro",
        stream="VIBESPRO_EVENTS",
        stream_sequence=42,
        message_id="6f1c2b1e-0000-4000-8000-000000000001",
        original_subject="vibespro.event.vibe_created.v1",
        reason_code="HANDLER_BAD_REQUEST",
        last_error=error,
        attempts=3,
        payload=payload,
        retry_history=history,
    )


@settings(max_examples=300, deadline=None)
@given(payloads, histories, st.text(max_size=5000), st.integers(16 * 1024, 64 * 1024))
def test_a_fitted_record_never_exceeds_its_limit_and_loses_no_payload_silently(
    payload: Any, history: list[dict[str, Any]], error: str, limit: int
) -> None:
    record = _record(payload, history, error)
    fitted = fit(record, limit)
    assert len(fitted.data) <= limit
    published = json.loads(fitted.data)
    if fitted.by_reference:
        kept = encode(payload)
        reference = published["payload"]
        assert reference["bytes"] == len(kept)
        assert reference["sha256"] == hashlib.sha256(kept).hexdigest()
        assert reference["original"] == {"stream": "VIBESPRO_EVENTS", "stream_sequence": 42}
    else:
        assert published["payload"] == json.loads(encode(payload))


def test_sizes_are_utf8_bytes_not_ascii_escapes() -> None:
    record = _record({"name": "Ж" * 1000}, [], "")
    assert len(encode(record["payload"])) == len('{"name":""}') + 2000
    assert not fit(record, 4000).by_reference  # 2 KB of UTF-8; ASCII-escaped it was 6 KB


def test_header_bytes_count_the_wire_form() -> None:
    assert header_bytes({"Nats-Msg-Id": "ab"}) == len(b"NATS/1.0\r\nNats-Msg-Id: ab\r\n\r\n")


def test_horizon_of_the_shipped_durable_is_its_whole_redelivery_schedule_plus_margin() -> None:
    spec = load_topology(ROOT / "topologies/sea-vibespro.yaml").durables["sea__from_vibespro"]
    horizon = redelivery_horizon(
        ack_wait=spec.ack_wait, max_deliver=spec.max_deliver, backoff=spec.backoff, margin=300
    )
    # 20 x 120 s of ack_wait; 19 gaps on the ladder 1, 5, 30, 120, then 600 s (15 times).
    assert horizon == 20 * 120 + (1 + 5 + 30 + 120 + 15 * 600) + 300


def test_horizon_of_a_single_delivery_has_no_ladder() -> None:
    assert redelivery_horizon(ack_wait=10, max_deliver=1, backoff=[99], margin=1) == 11


PROGRESS = DurableProgress(ack_floor=10, delivered=20, ack_pending=3)


@pytest.mark.parametrize(
    ("seq", "attempts", "replayed", "progress", "expected"),
    [
        (10, 1, False, PROGRESS, False),  # at the ack floor: settled
        (15, 1, False, PROGRESS, True),  # may be awaiting its redelivery
        (15, 4, False, PROGRESS, False),  # JetStream's cap reached: no more deliveries
        (15, 4, True, PROGRESS, True),  # the count includes a replay's deliveries
        (15, 1, False, DurableProgress(10, 20, 0), False),  # nothing awaits an ack
        (25, 1, False, DurableProgress(10, 20, 0), True),  # not even delivered yet
    ],
)
def test_whether_jetstream_may_still_deliver(
    seq: int, attempts: int, replayed: bool, progress: DurableProgress, expected: bool
) -> None:
    assert (
        may_still_be_delivered(
            stream_seq=seq,
            attempts=attempts,
            replayed=replayed,
            progress=progress,
            max_deliver=4,
        )
        is expected
    )


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), payloads, max_size=4), texts)
def test_the_stored_copy_fits_jsonb_and_replays_the_payload_byte_for_byte(
    payload: dict[str, Any], error: str
) -> None:
    stored = stored_record(_record(payload, [{"detail": error}], error))
    assert "\\u0000" not in stored
    stored.encode()  # no lone surrogate: PostgreSQL's jsonb takes it
    body = replay_body(json.loads(stored))
    assert body is not None
    assert json.loads(body.decode("utf-8", "surrogatepass")) == payload


def test_a_stored_copy_without_an_envelope_has_nothing_to_replay() -> None:
    assert replay_body(json.loads(stored_record(_record("raw\x00text", [], "")))) is None
    assert replay_body(json.loads(stored_record(_record(None, [], "")))) is None


@given(st.integers(0, 10**6), st.floats(0, 1e6), st.floats(0, 1e6))
def test_replay_delay_stays_within_its_cap_whatever_the_attempt(
    attempts: int, base: float, cap: float
) -> None:
    assert 0.0 <= replay_delay(base, cap, attempts) <= min(cap, base * 2.0**64)


@pytest.mark.parametrize(
    ("policy", "reason", "attempts", "expected"),
    [
        ("automatic", "MAX_DELIVERIES_EXCEEDED", 0, "dead"),
        ("automatic", "DELIVERY_EXHAUSTED_UNREPORTED", 0, "dead"),
        ("automatic", "SCHEMA_INVALID", 0, "held"),  # the same bytes cannot succeed
        ("automatic", "HANDLER_REJECTED", 5, "parked"),  # replay cap reached
        ("operator", "MAX_DELIVERIES_EXCEEDED", 0, "held"),
    ],
)
def test_where_a_dead_letter_starts(policy: str, reason: str, attempts: int, expected: str) -> None:
    assert initial_status(policy, reason, attempts, 5) == expected


def test_only_a_later_delivery_of_a_replay_in_flight_records_again() -> None:
    assert is_failed_replay("replaying", 7, 9)
    assert not is_failed_replay("replaying", 7, 7)  # a late advisory of the recorded one
    assert not is_failed_replay("replaying", 7, None)
    assert is_failed_replay("replaying", None, 1)
    assert not is_failed_replay("dead", 7, 9)


def test_a_history_event_keeps_500_characters_of_detail() -> None:
    event = history_event("failed", "HANDLER_REJECTED", "x" * 600, actor="me")
    assert event["event"] == "failed" and event["actor"] == "me"
    assert event["detail"] == "x" * 500 and event["at"].endswith("Z")
