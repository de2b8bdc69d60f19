"""The ACK rules (POL-047-005..007) as one pure decision.

``decide(outcome, attempt=..., policy=...)`` maps what the handler did to what the
consumer does with the JetStream message:

=================================  ===============================================
handler outcome                    decision
=================================  ===============================================
2xx                                Ack (processed)
409                                Ack (already processed; handler's own idempotency)
422                                DeadLetter HANDLER_REJECTED, then ack
400, 413, 415, other 4xx           DeadLetter HANDLER_BAD_REQUEST (will never succeed)
401, 403                           Nak + alert: credentials/config are wrong, not the message
404, 405                           Nak: route missing, typically mid-rollout
408, 425, 429, 5xx                 Nak, honouring Retry-After (see below)
3xx                                Nak: Ferry does not follow redirects; fix the URL
timeout, connection refused/reset  Nak
a retry with ``retryable: false``  DeadLetter HANDLER_NOT_RETRYABLE, then ack
4xx with ``retryable: true``       Nak instead of a 4xx dead letter (Retry-After too)
any Nak at attempt >= max_deliver  DeadLetter MAX_DELIVERIES_EXCEEDED, then ack
=================================  ===============================================

``retryable`` (INFRA-005 §3.1, "retry only when retryable=true") is read from a 4xx/5xx
JSON object body (:func:`body_retryable`). ``"retryable": false`` makes an answer the
table would retry (404, 405, 408, 425, 429, 5xx) final at once instead of spending the
ladder. ``"retryable": true`` makes a 4xx the table would dead-letter (400, 413, 422 …)
a retry: the handler says the fault is passing (a reference not there *yet*), and
``max_deliver`` still bounds it. Neither applies to 401/403: a credentials mismatch is
the configuration's fault, never the message's, and is held.

A Nak carries an explicit delay from the durable's back-off ladder (JetStream's
BackOff list does not apply to naks). A handler's Retry-After can lengthen it, never
shorten it: the delay is ``max(ladder step, min(Retry-After, retry_after_cap))``, so
``Retry-After: 0`` cannot spend every delivery in milliseconds. Every delay is finite
and ≥ 0 whatever the inputs (a nak with ``nan`` raises in the client).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

#: Statuses that mean the handler applied the event (or had already).
ACK_STATUSES = frozenset({409})
#: 4xx statuses worth retrying: the fault is elsewhere than in the message.
RETRYABLE_4XX = frozenset({401, 403, 404, 405, 408, 425, 429})
#: 4xx statuses that mean this configuration, not this message, is wrong (alert).
CONFIG_4XX = frozenset({401, 403, 404, 405})
#: Credentials refused: held whatever the body says (``retryable`` does not apply).
HELD_4XX = frozenset({401, 403})


@dataclass(frozen=True, slots=True)
class HandlerResponse:
    """The handler answered with ``status``."""

    status: int
    retry_after: float | None = None
    detail: str = ""
    #: The body's ``retryable`` flag (:func:`body_retryable`); None when it has none.
    retryable: bool | None = None


@dataclass(frozen=True, slots=True)
class HandlerFailure:
    """The handler could not be asked: ``kind`` is ``timeout`` or ``unreachable``."""

    kind: str
    detail: str = ""


Outcome = HandlerResponse | HandlerFailure


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A durable's retry settings."""

    backoff: tuple[float, ...]
    max_deliver: int
    #: Longest Retry-After honoured; a handler cannot park a message for a day.
    retry_after_cap: float = 600.0

    def __post_init__(self) -> None:
        if not self.backoff or not all(_usable(step) for step in self.backoff):
            raise ValueError(f"backoff must be finite delays >= 0, got {self.backoff!r}")
        if not _usable(self.retry_after_cap):
            raise ValueError(f"retry_after_cap must be finite and >= 0: {self.retry_after_cap}")

    def delay(self, attempt: int) -> float:
        """Back-off before the delivery after ``attempt`` (1-based)."""
        return self.backoff[min(max(attempt, 1), len(self.backoff)) - 1]

    def retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """The ladder's step, lengthened (never shortened) by a capped Retry-After."""
        step = self.delay(attempt)
        if retry_after is None or not _usable(retry_after):
            return step
        return max(step, min(retry_after, self.retry_after_cap))


@dataclass(frozen=True, slots=True)
class Ack:
    """Mark processed and ack."""

    reason: str


@dataclass(frozen=True, slots=True)
class Nak:
    """Leave unprocessed; redeliver after ``delay`` seconds."""

    delay: float
    reason: str
    alert: bool = False


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Write a dead-letter record, mark failed, ack the original."""

    reason_code: str
    detail: str


Decision = Ack | Nak | DeadLetter


def decide(outcome: Outcome, *, attempt: int, policy: RetryPolicy) -> Decision:
    """The one place where a handler outcome becomes an ack, a nak or a dead letter."""
    first = _first_decision(outcome, attempt=attempt, policy=policy)
    if isinstance(first, Nak) and attempt >= policy.max_deliver:
        return DeadLetter(
            "MAX_DELIVERIES_EXCEEDED",
            f"{first.reason} on delivery {attempt} of {policy.max_deliver}",
        )
    return first


def _first_decision(outcome: Outcome, *, attempt: int, policy: RetryPolicy) -> Decision:
    if isinstance(outcome, HandlerFailure):
        return Nak(policy.delay(attempt), f"handler {outcome.kind}: {outcome.detail}".strip(": "))
    status = outcome.status
    if 200 <= status < 300:
        return Ack("processed")
    if status in ACK_STATUSES:
        return Ack("already_processed")
    if outcome.retryable is True and 400 <= status < 500 and status not in RETRYABLE_4XX:
        delay = policy.retry_delay(attempt, outcome.retry_after)
        return Nak(delay, f"handler answered {status} with retryable: true")
    if status == 422:
        return DeadLetter("HANDLER_REJECTED", outcome.detail or "handler answered 422")
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return DeadLetter("HANDLER_BAD_REQUEST", f"handler answered {status}: {outcome.detail}")
    if outcome.retryable is False and status >= 400 and status not in HELD_4XX:
        return DeadLetter(
            "HANDLER_NOT_RETRYABLE",
            f"handler answered {status} with retryable: false: {outcome.detail}",
        )
    delay = policy.retry_delay(attempt, outcome.retry_after)
    reason = f"handler answered {status}"
    return Nak(delay, reason, alert=status in CONFIG_4XX or 300 <= status < 400)


def body_retryable(body: bytes | str) -> bool | None:
    """The ``retryable`` member of a JSON object body, or None (absent, not a boolean, not
    a JSON object, or cut short: the consumer reads at most the body's first 2 kB)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    value = doc.get("retryable") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def _usable(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds >= 0
