"""What a handler answers, and the exceptions a route raises to choose it.

Each answer is an :class:`Outcome` (status, JSON body, headers). The consumer's ACK table
(:mod:`shared.domain.ack`) decides what the status does to the message; every 4xx/5xx body
built here also says so in a machine-readable ``retryable`` member (INFRA-005 §3.1):

==========================  ======  =========  ======================================
constructor / exception     status  retryable  what the consumer does
==========================  ======  =========  ======================================
:meth:`Outcome.processed`   200     —          ack (processed)
:meth:`Outcome.duplicate`   409     —          ack (already processed)
:meth:`Outcome.reject`      422     false      dead letter ``HANDLER_REJECTED``
:class:`Reject`
:meth:`Outcome.bad_request` 400     false      dead letter ``HANDLER_BAD_REQUEST``
:meth:`Outcome.retry`       503     true       retry after max(ladder, Retry-After)
:class:`Retry`              or 429
:meth:`Outcome.give_up`     500     false      dead letter ``HANDLER_NOT_RETRYABLE``
:class:`GiveUp`
:meth:`Outcome.failed`      500     true       retry on the ladder (an unexpected error)
:meth:`Outcome.unauth…`     401     true       held, alerted, called again (credentials)
==========================  ======  =========  ======================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.domain.envelope import format_timestamp
from shared.domain.errors import FerryError, PoisonError

#: Statuses a :class:`Retry` may answer: both are retried by the consumer, and honour
#: ``Retry-After``.
RETRY_STATUSES = frozenset({429, 503})
#: An error text in a body is cut to this many characters (the consumer keeps 500).
MAX_ERROR = 400


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def retry_after_value(seconds: float) -> str:
    """``seconds`` as a ``Retry-After`` value: RFC 9110 wants whole seconds, so a fraction
    is rounded up (0.25 → ``1``)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"Retry-After must be finite and >= 0, got {seconds!r}")
    return str(math.ceil(seconds))


@dataclass(frozen=True, slots=True)
class Outcome:
    """An answer: status, JSON body (None: no body) and extra headers."""

    status: int
    body: dict[str, Any] | None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def retryable(self) -> bool | None:
        """The body's ``retryable`` member, if it has one."""
        value = (self.body or {}).get("retryable")
        return value if isinstance(value, bool) else None

    @classmethod
    def processed(cls, message_id: str) -> Outcome:
        """200: the effect committed with the claim."""
        return cls(200, {"status": "processed", "message_id": message_id})

    @classmethod
    def duplicate(cls, message_id: str, applied_at: datetime | None = None) -> Outcome:
        """409: this message id was applied before; nothing changed."""
        body: dict[str, Any] = {"status": "already_processed", "message_id": message_id}
        if applied_at is not None:
            body["applied_at"] = format_timestamp(applied_at)
        return cls(409, body)

    @classmethod
    def reject(cls, reason_code: str, detail: str) -> Outcome:
        """422: this event can never be applied (dead-lettered with this body)."""
        return cls(422, {"error": _cut(detail), "reason_code": reason_code, "retryable": False})

    @classmethod
    def bad_request(cls, reason_code: str, detail: str) -> Outcome:
        """400: the request itself is malformed (not JSON, not an envelope...)."""
        return cls(400, {"error": _cut(detail), "reason_code": reason_code, "retryable": False})

    @classmethod
    def retry(cls, detail: str, *, after: float | None = None, status: int = 503) -> Outcome:
        """503 (or 429): not now; call again, no sooner than ``after`` seconds if given."""
        if status not in RETRY_STATUSES:
            raise ValueError(f"a retry answers one of {sorted(RETRY_STATUSES)}, not {status}")
        headers = {} if after is None else {"Retry-After": retry_after_value(after)}
        return cls(status, {"error": _cut(detail), "retryable": True}, headers)

    @classmethod
    def give_up(cls, detail: str, *, reason_code: str = "NOT_RETRYABLE") -> Outcome:
        """500 with ``retryable: false``: failed in a way no retry can fix."""
        return cls(500, {"error": _cut(detail), "reason_code": reason_code, "retryable": False})

    @classmethod
    def failed(cls, detail: str) -> Outcome:
        """500: an unexpected error; the consumer retries it."""
        return cls(500, {"error": _cut(detail), "retryable": True})

    @classmethod
    def unauthenticated(cls, detail: str) -> Outcome:
        """401: the signature is missing, wrong or stale."""
        return cls(
            401,
            {
                "error": "unauthenticated",
                "reason_code": "BAD_SIGNATURE",
                "detail": detail,
                "retryable": True,
            },
            {"WWW-Authenticate": 'Ferry-HMAC realm="handle"'},
        )


class Reject(PoisonError):
    """Raise from a route: the event can never be applied → 422 with ``reason_code``.

    Every :class:`~shared.domain.errors.PoisonError` is answered the same way.
    """


class Retry(FerryError):
    """Raise from a route: not now (a dependency is down, a quota is spent) → 503 or 429,
    with ``Retry-After: after`` when given. The transaction rolls back, claim included."""

    def __init__(self, detail: str, *, after: float | None = None, status: int = 503) -> None:
        super().__init__(detail)
        self.outcome = Outcome.retry(detail, after=after, status=status)


class GiveUp(FerryError):
    """Raise from a route: failed for good, though the event itself may be fine (say, the
    account it concerns was closed) → 500 with ``retryable: false``, dead-lettered as
    ``HANDLER_NOT_RETRYABLE`` at once. The transaction rolls back, claim included."""

    def __init__(self, detail: str, *, reason_code: str = "NOT_RETRYABLE") -> None:
        super().__init__(detail)
        self.outcome = Outcome.give_up(detail, reason_code=reason_code)
