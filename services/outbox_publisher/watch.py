"""While commits come quickly, the publisher looks at the outbox on a timer and says so.

Every commit with outbox rows sends a NOTIFY (migrations/0001_outbox.sql), and a NOTIFY
is dear: PostgreSQL serialises the commits of the whole cluster that notify, each
holding one lock until it is flushed (migrations/0014_outbox_watch.sql has the
figures). Under steady traffic those NOTIFYs tell the publisher nothing it would not
find by claiming every few milliseconds, which it does anyway to fill its batches.

So when NOTIFYs come quicker than :attr:`OutboxWatch.period` apart, the publisher
*watches*: it writes a promise into ``outbox_watch`` (claim at least every period, until
a time a second ahead, renewed while rows keep coming), wakes a worker to claim every
period, and the outbox trigger skips the NOTIFY while a promise holds. When a period's
claims find nothing for :data:`QUIET_SECONDS`, it deletes the promise; commits notify
again from then on.

No row is left behind. A producer's trigger looks at the promise when it INSERTs, so a
transaction may skip its NOTIFY under a promise and commit after the watch ended. The
watch therefore goes on claiming after each promise, at one period, then two, four...
up to the poll interval, and the workers still claim every poll interval in any case
(``FERRY_POLL_INTERVAL``): such a row waits at most about twice its own commit's delay
past the promise, and never longer than without the watch. A promise the publisher
could not delete (the database away) lapses by itself; until then the watch keeps
claiming every period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Protocol

from shared.adapters.postgres import DATABASE_ERRORS, NO_TABLE_ERRORS, NOT_PERMITTED_ERRORS, Pool
from shared.domain.pacing import ArrivalGap
from shared.waits import sleep_unless, wait_any

log = logging.getLogger("ferry.outbox_publisher")

#: A watch ends when its claims found no row for this long (and three periods at least).
QUIET_SECONDS = 0.1
#: How long one promise holds; it is renewed when half of it is left.
LEASE_SECONDS = 1.0
#: The shortest period: below it the claims would cost more than the NOTIFYs they spare.
MIN_PERIOD = 0.005

_PROMISE = (
    "INSERT INTO outbox_watch (publisher, watch_until, period_ms)"
    " VALUES ($1, clock_timestamp() + make_interval(secs => $2), $3)"
    " ON CONFLICT (publisher) DO UPDATE SET watch_until = EXCLUDED.watch_until,"
    " period_ms = EXCLUDED.period_ms, since = CASE WHEN outbox_watch.watch_until"
    " < clock_timestamp() THEN clock_timestamp() ELSE outbox_watch.since END"
)
_END = "DELETE FROM outbox_watch WHERE publisher = $1"
#: What a write of the watch may meet: it is logged, and the watch goes on.
_WRITE_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, TimeoutError)
#: The table missing (migrations/0014 not applied) or the publisher's login without its
#: grant (``ferry db-roles`` not run since): the watch turns itself off.
_SETUP_ERRORS: tuple[type[BaseException], ...] = (*NO_TABLE_ERRORS, *NOT_PERMITTED_ERRORS)
#: Promises of publishers long gone (a crash): harmless once past, removed at start.
_FORGET = "DELETE FROM outbox_watch WHERE watch_until < clock_timestamp() - interval '1 hour'"


class Watched(Protocol):
    """What the watch needs of the publisher."""

    #: The pace of NOTIFYs.
    arrivals: ArrivalGap
    #: Rows claimed so far (any worker).
    claimed_rows: int

    def tick(self) -> None:
        """Wake one worker to claim (no NOTIFY came: the watch's turn)."""


class WatchMetrics(Protocol):
    """Where the watch reports (the publisher's metrics)."""

    def watching(self, on: bool) -> None:
        """Whether a promise may hold now; a start counts one watch."""


def instance_name() -> str:
    """This process's name in ``outbox_watch``: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class OutboxWatch:
    """Claims on a timer while commits come quickly, with a promise that spares NOTIFYs."""

    def __init__(
        self,
        pool: Pool,
        publisher: Watched,
        *,
        period: float,
        poll_interval: float,
        lease: float = LEASE_SECONDS,
        instance: str | None = None,
        metrics: WatchMetrics | None = None,
    ) -> None:
        if period <= 0 or lease <= 2 * period:
            raise ValueError(f"a watch needs 0 < period and 2 x period < lease, not "
                             f"period {period} s, lease {lease} s")  # fmt: skip
        self.pool, self.publisher, self.metrics = pool, publisher, metrics
        self.period, self.poll_interval, self.lease = period, poll_interval, lease
        self.instance = instance or instance_name()
        #: True from the watch's start to its end (the workers then claim without lingering).
        self.watching = False
        #: Monotonic time by which any promise of this process has surely lapsed.
        self.until = 0.0
        #: Watches started, and promises that could not be written or deleted.
        self.watches = 0
        self.errors = 0
        #: Turned off for good: ``outbox_watch`` is missing or may not be written.
        self.disabled = False
        self._start = asyncio.Event()

    @property
    def quiet(self) -> float:
        """Seconds without a claimed row after which the watch ends."""
        return max(QUIET_SECONDS, 3 * self.period)

    def arrived(self) -> None:
        """A NOTIFY came: once they come quicker than the period, start watching."""
        if self.disabled or self.watching:
            return
        if self.publisher.arrivals.expects_within(self.period):
            self._start.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch whenever NOTIFYs come quickly, until ``stop``."""
        await self._write(_FORGET)
        try:
            while not stop.is_set():
                await wait_any(self._start, stop, timeout=None)
                if stop.is_set():
                    break
                self._start.clear()
                if self.disabled:
                    continue
                try:
                    await self._watch(stop)
                    await self._after(stop)
                except Exception:  # a bug or a surprise: the workers and the poll go on
                    self.errors += 1
                    log.exception(
                        "outbox watch failed; commits notify again once its promise lapses, "
                        "and the next quick NOTIFYs watch again"
                    )
                    await sleep_unless(stop, self.lease)
        finally:
            if self.watching or self.until > time.monotonic():
                await self._end()

    async def _watch(self, stop: asyncio.Event) -> None:
        self.watching = True
        self.watches += 1
        if self.metrics is not None:
            self.metrics.watching(True)
        log.debug("watching the outbox every %.0f ms", self.period * 1000)
        try:
            await self._promise()
            found_at = time.monotonic()
            while not stop.is_set() and not self.disabled:
                before = self.publisher.claimed_rows
                self.publisher.tick()
                await sleep_unless(stop, self.period)
                now = time.monotonic()
                if self.publisher.claimed_rows != before:
                    found_at = now
                elif now - found_at >= self.quiet:
                    break
                if self.until - now < self.lease / 2:
                    await self._promise()
        finally:
            self.watching = False
            await self._end()
            # Two NOTIFYs must come quickly again before the next watch, not one.
            self.publisher.arrivals = ArrivalGap(self.publisher.arrivals.weight)

    async def _after(self, stop: asyncio.Event) -> None:
        """Claims after a promise, for commits whose trigger saw it but landed later."""
        while time.monotonic() < self.until and not stop.is_set() and not self._start.is_set():
            # The promise may still hold (it could not be deleted): the period still binds.
            self.publisher.tick()
            await wait_any(self._start, stop, timeout=self.period)
        gap = self.period
        while gap < self.poll_interval and not stop.is_set() and not self._start.is_set():
            await wait_any(self._start, stop, timeout=gap)
            if self._start.is_set() or stop.is_set():
                break
            self.publisher.tick()
            gap *= 2
        if self.metrics is not None and not self._start.is_set():
            self.metrics.watching(False)

    async def _promise(self) -> None:
        """Write (or renew) the promise; from now on it may hold until ``until``."""
        period_ms = max(1, round(self.period * 1000))
        await self._write(_PROMISE, self.instance, self.lease, period_ms)
        # Written or not (an error may come after the server wrote it), it may hold.
        self.until = max(self.until, time.monotonic() + self.lease)

    async def _end(self) -> None:
        if await self._write(_END, self.instance):
            self.until = time.monotonic()

    async def _write(self, sql: str, *args: object) -> bool:
        try:
            async with self.pool.acquire(timeout=self.lease) as conn:
                await conn.execute(sql, *args, timeout=self.lease)
        except _SETUP_ERRORS as exc:
            # Not a passing fault: the table or the grant is missing. Commits keep their
            # NOTIFY (nothing is promised); say once what to do.
            self.errors += 1
            if not self.disabled:
                log.error("outbox watch off for this process: %s (%s). Every commit keeps "
                          "its NOTIFY; run `ferry migrate` and `ferry db-roles`, then restart "
                          "the publisher", exc, type(exc).__name__)  # fmt: skip
            self.disabled = True
            return False
        except _WRITE_ERRORS as exc:
            self.errors += 1
            log.warning("outbox watch: %s failed: %s", sql.split()[0].lower(), exc)
            return False
        return True
