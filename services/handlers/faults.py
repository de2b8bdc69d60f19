"""Fault injection driven by the payload, for demos, tests and chaos runs.

**Off unless the service is started with** ``FERRY_HANDLER_FAULT_INJECTION=true``
(:class:`~services.handlers.settings.HandlerSettings`); off, ``"_ferry_test"`` is ordinary
payload data that changes nothing, so no producer can drive a handler's answers. The
service refuses to start with it on in production (``FERRY_ENVIRONMENT=production``,
set by ``k8s/overlays/prod``).

On, a payload may carry a ``"_ferry_test"`` object; without it the call is processed
normally. Its keys, all optional:

``"slow_ms": M``
    Sleep M milliseconds (at most :data:`MAX_SLOW_MS`) before doing anything else (the
    outcome is unchanged, so a consumer whose timeout is shorter sees a timeout while the
    effect may still commit afterwards, which is exactly the case the 409 contract exists
    for).
``"poison": true``
    Answer 422 on every attempt (``reason_code`` ``TEST_POISON``).
``"reject_until": "<RFC 3339 time>"``
    Answer 422 (``reason_code`` ``TEST_REJECTED``) until that moment, then process
    normally: a handler bug fixed at a known time, so a dead letter's replay succeeds.
``"status": code``
    Answer ``code`` (an integer in 200..599, e.g. 404, 400, 301, 500) on every attempt,
    without processing.
``"fail_attempts": N``
    Answer 503 while ``delivery.attempt <= N``, then process normally.
``"retry_after": S``
    With ``fail_attempts``: send ``Retry-After: S`` on those 503s. S is seconds; a
    fraction (``0.2``) is outside RFC 9110 but lets tests run fast, and is sent as given.

Precedence: ``poison``, then ``reject_until``, then ``status``, then ``fail_attempts``.
The event is still schema-checked first, so a malformed payload is a 422 whatever the
directive says. An unknown key or a wrongly typed value is itself a 422, so a typo
never silently turns a fault test into a success.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.domain.envelope import parse_timestamp
from shared.domain.errors import PoisonError
from shared.sdk import Call, Outcome

#: The payload key that carries the directives.
FAULT_KEY = "_ferry_test"
_KEYS = frozenset({"poison", "reject_until", "status", "fail_attempts", "retry_after", "slow_ms"})
#: The longest ``slow_ms`` obeyed: a minute, the largest handler timeout of the shipped
#: topologies. More is itself a 422 (``INVALID_TEST_DIRECTIVE``), so no payload can hold
#: a call open without bound.
MAX_SLOW_MS = 60_000


@dataclass(frozen=True, slots=True)
class ForcedAnswer:
    """A response the directives impose instead of processing."""

    status: int
    error: str
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Faults:
    """The parsed directives of one payload (all off by default)."""

    poison: bool = False
    status: int | None = None
    fail_attempts: int = 0
    retry_after: float | None = None
    slow_ms: int = 0
    reject_until: datetime | None = None

    async def pause(self) -> None:
        """Sleep ``slow_ms`` (no-op when zero)."""
        if self.slow_ms:
            await asyncio.sleep(self.slow_ms / 1000)

    def check_poison(self) -> None:
        """Raise the injected poison, if any (a 422 like any other poison)."""
        if self.poison:
            raise PoisonError("TEST_POISON", f"payload.{FAULT_KEY}.poison is set")
        if self.reject_until is not None and datetime.now(UTC) < self.reject_until:
            raise PoisonError(
                "TEST_REJECTED", f"payload.{FAULT_KEY}.reject_until is {self.reject_until}"
            )

    def forced(self, attempt: int) -> ForcedAnswer | None:
        """The status to answer on ``attempt`` instead of processing, if any."""
        if self.status is not None:
            return ForcedAnswer(self.status, f"injected status {self.status}", {})
        if attempt <= self.fail_attempts:
            headers: dict[str, str] = {}
            if self.retry_after is not None:
                headers["Retry-After"] = _seconds(self.retry_after)
            return ForcedAnswer(
                503, f"injected failure on attempt {attempt} of {self.fail_attempts}", headers
            )
        return None


#: No directive: what every call gets when fault injection is off.
NO_FAULTS = Faults()


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def parse_faults(payload: Mapping[str, Any]) -> Faults:
    """Read ``payload[FAULT_KEY]``; raise ``INVALID_TEST_DIRECTIVE`` when it is malformed."""
    raw = payload.get(FAULT_KEY)
    if raw is None:
        return Faults()
    if not isinstance(raw, dict):
        raise _invalid("", "must be an object")
    unknown = set(raw) - _KEYS
    if unknown:
        raise _invalid("", f"unknown key(s) {', '.join(sorted(unknown))}")
    poison = raw.get("poison", False)
    if not isinstance(poison, bool):
        raise _invalid("poison", "must be true or false")
    return Faults(
        poison=poison,
        status=_status(raw.get("status")),
        fail_attempts=_count(raw, "fail_attempts"),
        retry_after=_retry_after(raw.get("retry_after")),
        slow_ms=_count(raw, "slow_ms", MAX_SLOW_MS),
        reject_until=_moment(raw.get("reject_until")),
    )


def _moment(value: object) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_timestamp(str(value))
    except ValueError as exc:
        raise _invalid("reject_until", f"must be an RFC 3339 time with a zone: {exc}") from exc


def _invalid(key: str, reason: str) -> PoisonError:
    where = f"payload.{FAULT_KEY}" + (f".{key}" if key else "")
    return PoisonError("INVALID_TEST_DIRECTIVE", f"{where}: {reason}")


def _status(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 200 <= value <= 599:
        raise _invalid("status", f"must be an HTTP status in 200..599, got {value!r}")
    return value


def _count(raw: Mapping[str, Any], key: str, most: int | None = None) -> int:
    value = raw.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _invalid(key, f"must be a non-negative integer, got {value!r}")
    if most is not None and value > most:
        raise _invalid(key, f"must be at most {most}, got {value!r}")
    return value


def _retry_after(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise _invalid("retry_after", f"must be a non-negative number of seconds, got {value!r}")
    return float(value)


class FaultInjection:
    """The directives as an SDK hook (:class:`shared.sdk.Hook`), installed only when
    FERRY_HANDLER_FAULT_INJECTION is on.

    Before the claim: a malformed directive, ``poison`` or ``reject_until`` is a 422, and
    the routes see the payload without ``_ferry_test`` (the directive was the service's,
    not business data); then ``slow_ms`` sleeps and a forced status answers instead.
    """

    def prepare(self, call: Call[Any]) -> Call[Any]:
        """Check the directive; the call with the payload the routes store."""
        payload = call.envelope.payload
        parse_faults(payload).check_poison()
        if FAULT_KEY not in payload:
            return call
        return call.with_payload({k: v for k, v in payload.items() if k != FAULT_KEY})

    async def before(self, call: Call[Any]) -> Outcome | None:
        """Sleep ``slow_ms``; the injected answer for this attempt, if any."""
        faults = parse_faults(call.envelope.payload)
        await faults.pause()
        forced = faults.forced(call.delivery.attempt)
        if forced is None:
            return None
        return Outcome(forced.status, {"error": forced.error}, forced.headers)
