"""The dead-letter record (INFRA-005 §4 and EVT-047-002 MessageDeadLettered in one document)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.domain.envelope import format_timestamp

#: Reasons that are defects of the message's own bytes: replaying the same bytes cannot
#: change the outcome, so even the automatic policy holds them for an operator.
NOT_REPLAYABLE = frozenset(
    {
        "MALFORMED_JSON",
        "MALFORMED_ENVELOPE",
        "MISSING_FIELD",
        "INVALID_FIELD",
        "INVALID_SUBJECT",
        "SUBJECT_MISMATCH",
        "DIGEST_MISMATCH",
        "SCHEMA_INVALID",
        "MESSAGE_TOO_LARGE",
    }
)


#: Statuses an operator may replay from, and those that are final.
REPLAYABLE_STATUSES = ("dead", "held", "parked")
FINAL_STATUSES = ("replayed", "discarded")
#: Statuses a dead letter may be parked from, and discarded from.
PARKABLE_STATUSES = ("dead", "held")
DISCARDABLE_STATUSES = ("dead", "held", "parked", "replaying")


def replay_delay(
    base_delay: float, max_delay: float, replay_attempts: int, rng: random.Random | None = None
) -> float:
    """Full-jitter exponential back-off before replay number ``replay_attempts + 1``:
    uniform in ``[0, min(max_delay, base_delay * 2**replay_attempts))``."""
    ceiling = min(max_delay, base_delay * 2.0 ** min(replay_attempts, 64))
    return (rng or random).uniform(0.0, ceiling)


def initial_status(
    replay_policy: str, reason_code: str, replay_attempts: int, max_attempts: int
) -> str:
    """Where a new (or again) dead letter starts: dead (auto-replay), held, or parked."""
    if replay_policy != "automatic" or reason_code in NOT_REPLAYABLE:
        return "held"
    if replay_attempts >= max_attempts:
        return "parked"
    return "dead"


def is_failed_replay(status: str, recorded_seq: int | None, failure_seq: int | None) -> bool:
    """A replay of this dead letter is in flight and this failure is of that replay, not older.

    A replay is published into the stream of the failure it repeats, so its sequence is
    always greater than the recorded one (``recorded_seq``, which the replay never changes);
    a late advisory for the recorded delivery (or an earlier one) is never greater.
    """
    return bool(
        status == "replaying" and failure_seq is not None and failure_seq > (recorded_seq or 0)
    )


def history_event(kind: str, reason: str, detail: str, **extra: Any) -> dict[str, Any]:
    """One entry of a dead letter's replay history (failed again, replayed, parked...)."""
    return {
        "event": kind,
        "at": format_timestamp(datetime.now(UTC)),
        "reason": reason,
        "detail": detail[:500],
        **extra,
    }


def dead_letter_record(
    *,
    durable: str,
    stream: str,
    stream_sequence: int,
    message_id: str,
    original_subject: str,
    reason_code: str,
    last_error: str,
    attempts: int,
    payload: Any,
    retry_history: list[dict[str, Any]],
    traceparent: str | None = None,
) -> dict[str, Any]:
    """Everything an operator (or the replayer) needs to understand and replay a failure.

    ``payload`` is the original message body: the parsed envelope when it parsed, else
    the raw text, so nothing is lost even for a message that was not JSON.
    """
    return {
        # EVT-047-002
        "message_id": message_id,
        "original_subject": original_subject,
        "reason": reason_code,
        "attempts": attempts,
        # INFRA-005 §4
        "failedStream": stream,
        "reasonCode": reason_code,
        "lastError": last_error,
        "payload": payload,
        "retryHistory": retry_history,
        # Ferry
        "durable": durable,
        "stream_sequence": stream_sequence,
        "traceparent": traceparent,
        "dead_lettered_at": format_timestamp(datetime.now(UTC)),
    }


# --------------------------------------------------------------------------- the sweep

#: Reason of a dead letter the sweep recorded: deliveries ran out, no advisory said so.
SWEEP_REASON = "DELIVERY_EXHAUSTED_UNREPORTED"


def redelivery_horizon(
    *, ack_wait: float, max_deliver: int, backoff: Sequence[float], margin: float
) -> float:
    """Seconds after which an untouched, non-final inbox row is no longer JetStream's.

    Every delivery of a message touches its inbox row (the claim). Between two deliveries
    JetStream waits at most ``ack_wait`` (a consumer that vanished mid-delivery) plus the
    ladder's step (the nak's delay); after ``max_deliver`` of them it gives up and emits
    MAX_DELIVERIES. So ``ack_wait * max_deliver`` plus the ladder's first
    ``max_deliver - 1`` steps bounds, loosely, how long a row can stay untouched while its
    message is still on its way; ``margin`` covers what the ladder does not know (a
    Retry-After longer than the step, the router catching up on advisories). The horizon
    only gives the advisory path its time: whether JetStream still holds the message is
    checked apart (:func:`may_still_be_delivered`).
    """
    steps = [backoff[min(i, len(backoff) - 1)] for i in range(max(max_deliver - 1, 0))]
    return ack_wait * max_deliver + sum(steps) + margin


@dataclass(frozen=True)
class DurableProgress:
    """A durable's delivery state as JetStream reports it (consumer info)."""

    ack_floor: int
    delivered: int
    ack_pending: int


def may_still_be_delivered(
    *, stream_seq: int, attempts: int, replayed: bool, progress: DurableProgress, max_deliver: int
) -> bool:
    """Whether JetStream may still deliver the message at ``stream_seq`` to the durable.

    It will not when the sequence is at or below the ack floor (settled), when it was
    delivered and nothing at all is awaiting an ack (nothing pending to redeliver), or
    when the row counts ``max_deliver`` deliveries already (JetStream's cap) and was never
    replayed (a replay's deliveries are counted on the same row, but on a new sequence).
    A message exhausted by JetStream leaves the ack floor behind it, so the floor alone
    would hold the sweep back for good on a busy durable.
    """
    if stream_seq <= progress.ack_floor:
        return False
    if progress.ack_pending == 0 and stream_seq <= progress.delivered:
        return False
    return not (attempts >= max_deliver and not replayed)
