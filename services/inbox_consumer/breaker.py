"""The circuit breaker: stop calling a handler that is down, hold what is in hand, probe.

Without it, every message in flight while a handler is down keeps being called on the
back-off ladder, spends its deliveries and climbs the ladder while it does; measured on
the SEA -> VibesPro lane (issue 45): the handler down for 3 minutes while 1,000 events
arrived, and the first event applied 576 s after it came back — the backlog was waiting
out the ladder's 600 s step. A longer outage turns the backlog into dead letters.

**Closed** (normal): every call goes through. ``failures`` calls in a row that failed
(:func:`failed`: a timeout, no connection, 5xx, 429) within ``window`` seconds open it.
**Open**: no call goes through; callers wait at :meth:`CircuitBreaker.admit` holding their
messages (the keeper heart-beats them, so JetStream neither redelivers them nor counts a
delivery; what is not fetched yet waits in the stream). Every ``probe_every`` seconds one
caller is let through as the **probe** (half-open); its success closes the breaker and
lets every waiter through. A call that fails while the breaker is not closed — a failed
probe, the failure that opened it, a call that was out when it opened — keeps its
messages in hand too (:meth:`CircuitBreaker.holds`): they are not nak'ed up the back-off
ladder (whose long steps, and the max_ack_pending places they would hold, kept a lane
idle for minutes after its handler came back) but wait for the next probe, at most
:data:`KEEP_AT_MOST` times each when no other caller waits. So an outage spends hardly
a delivery beyond the calls that failed before the breaker opened.

A stop ends every wait: the call is not made, and the caller gets :data:`STOPPING` (an
unreachable handler), so its message is nak'ed like a failed call and redelivered to
whoever runs next.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shared.contracts.topology import BreakerSpec
from shared.domain.ack import HandlerFailure, HandlerResponse

log = logging.getLogger("ferry.inbox_consumer")

#: What a caller stopped at an open breaker gets instead of an answer.
STOPPING = HandlerFailure("unreachable", "circuit breaker open, consumer stopping")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
#: Failed calls of one message (or batch) kept in hand for a later probe while no other
#: caller waits at the breaker, at most; then it is settled as any failed call (nak'ed with
#: its back-off): a handler that fails on one event alone, with no other traffic to close
#: the breaker, still dead-letters it in time. While others wait (a handler down for
#: everyone), a failed call is kept as long as the breaker stays open.
KEEP_AT_MOST = 10
#: Longest a failed call is kept in hand, others waiting or not (s); then it is settled
#: as any failed call. Past any outage the breaker is for (the issue's 30 minutes), short
#: of forever: events the handler fails on (a 5xx caused by their content) with no other
#: traffic to close the breaker wait on each other, none ever alone, and would otherwise
#: hold the lane for good instead of reaching their dead letters.
KEEP_FOR = 3600.0
#: Longest a waiter sleeps before it looks at the state and the clock again (s).
RECHECK = 1.0
#: The state as a number, for the metric.
STATE_VALUES = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}


def failed(outcome: Any) -> bool:
    """Whether a call's outcome says the handler is down or overwhelmed (not an answer
    about the event: a 422, 409 or a batch's per-event results are the handler working)."""
    if isinstance(outcome, HandlerFailure):
        return True
    if isinstance(outcome, HandlerResponse):
        return outcome.status >= 500 or outcome.status == 429
    return False


class CircuitBreaker:
    """One durable's breaker (see the module's documentation); ``clock`` is for tests."""

    def __init__(
        self,
        spec: BreakerSpec,
        *,
        durable: str,
        clock: Callable[[], float] = time.monotonic,
        recheck: float = RECHECK,
        keep_for: float = KEEP_FOR,
    ) -> None:
        self.spec, self.durable, self.clock, self.recheck = spec, durable, clock, recheck
        #: Longest a failed call is kept in hand (:data:`KEEP_FOR`).
        self.keep_for = keep_for
        self.state = CLOSED
        #: When the state last changed (wall clock, for the console).
        self.since: datetime | None = None
        #: Failures since the last success (their times), while closed.
        self._failures: collections.deque[float] = collections.deque()
        self._next_probe = 0.0
        self._changed = asyncio.Event()
        #: Times the breaker opened; probes let through; callers that waited at it.
        self.opened = 0
        self.probes = 0
        #: Failed calls whose messages were kept in hand for a later probe (not nak'ed).
        self.kept = 0
        #: Callers waiting at it now (other traffic that a healthy handler would answer).
        self.waiting = 0
        self.held = 0

    @property
    def enabled(self) -> bool:
        return self.spec.enabled

    async def admit(self, stop: asyncio.Event) -> bool:
        """Wait until a call may go through; False when ``stop`` was set meanwhile."""
        waited = False
        try:
            while self.enabled:
                if self.state == CLOSED:
                    break
                now = self.clock()
                if self.state == OPEN and now >= self._next_probe:
                    self._set(HALF_OPEN)
                    self.probes += 1
                    log.info("%s: circuit breaker half-open: probing the handler", self.durable)
                    break
                if stop.is_set():
                    return False
                if not waited:
                    waited = True
                    self.held += 1
                    self.waiting += 1
                self._changed.clear()
                wake = self.recheck
                if self.state == OPEN:
                    wake = min(max(self._next_probe - now, 0.01), self.recheck)
                waiting = [asyncio.ensure_future(self._changed.wait())]
                waiting.append(asyncio.ensure_future(stop.wait()))
                try:
                    await asyncio.wait(waiting, timeout=wake, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in waiting:
                        task.cancel()
            return True
        finally:
            if waited:
                self.waiting -= 1

    def holds(self, outcome: Any) -> bool:
        """Whether a call that ended with ``outcome`` keeps its messages in hand for the
        next probe instead of settling them: it failed and the breaker is not closed."""
        if self.enabled and failed(outcome) and self.state != CLOSED:
            self.kept += 1
            return True
        return False

    def record(self, outcome: Any) -> None:
        """The outcome of a call :meth:`admit` let through."""
        if not self.enabled:
            return
        now, bad = self.clock(), failed(outcome)
        if self.state == HALF_OPEN:
            if bad:
                self._open(now, "the probe failed")
            else:
                self._close()
            return
        if self.state == OPEN:  # a call admitted before it opened, answering late
            if not bad:
                self._close()
            return
        if not bad:
            self._failures.clear()
            return
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.spec.window:
            self._failures.popleft()
        if len(self._failures) >= self.spec.failures:
            self.opened += 1
            self._open(now, f"{len(self._failures)} calls in a row failed")

    def _set(self, state: str) -> None:
        if state != self.state:
            self.state, self.since = state, datetime.now(UTC)

    def report(self) -> tuple[str, datetime | None]:
        """Its state and since when (``throttle_members``: what the console shows);
        ``disabled`` when the topology turned it off."""
        return (self.state if self.enabled else "disabled"), self.since

    def _open(self, now: float, why: str) -> None:
        self._set(OPEN)
        self._failures.clear()
        self._next_probe = now + self.spec.probe_every
        log.warning(
            "%s: circuit breaker open (%s): holding messages, probing every %gs",
            self.durable,
            why,
            self.spec.probe_every,
        )
        self._changed.set()

    def _close(self) -> None:
        self._set(CLOSED)
        self._failures.clear()
        log.warning("%s: circuit breaker closed: the handler answers again", self.durable)
        self._changed.set()
