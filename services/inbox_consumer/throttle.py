"""Controlled throttling (INFRA-005 §7.3): a token bucket in front of the handler.

The run loop asks :meth:`Throttle.admit` before each fetch: it waits until the bucket
holds a token and answers how many messages may be fetched now (at most the tokens in
the bucket); the loop takes one token per message actually fetched (:meth:`Throttle.spent`).
So a throttled durable's handler receives at most ``rate`` messages a second on average,
in bursts of at most ``burst``. The limit is the durable's, not a process's: every poll
marks this process alive in ``throttle_members`` and counts the processes seen lately, and
each takes ``rate / n`` and ``burst / n`` (:func:`split`) — scaling out (KEDA) does not
multiply the rate. A process that stops deletes its row; one that dies ages out after
three poll intervals (meanwhile the others run below the limit, never above it for longer
than a poll after a new one starts).

Nothing waits unprotected: the pull window shrinks with the limit (:meth:`Throttle.window`,
so at most about half an ack_wait's worth of messages is requested ahead), and whatever
did arrive and waits in the puller is heart-beaten (``in_progress``) like every message in
hand (:mod:`.keepalive`): a message never runs out its ack_wait, nor uses up a delivery,
because the throttle made it wait.

The limit in force is the topology's ``throttle:`` unless an operator has set an override
(``ferry durable throttle``, table ``throttle_overrides``), which :meth:`Throttle.watch`
reads every few seconds: a running consumer changes its rate without a restart and
without losing or redelivering anything. A ``criticality: high`` durable is never
throttled (the lint refuses a topology throttle; an override row is ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from prometheus_client.core import Metric

from services.inbox_consumer.metrics import throttle_families
from shared.adapters import circuits, throttles
from shared.adapters.postgres import DATABASE_ERRORS
from shared.adapters.throttles import Override
from shared.contracts.topology import DurableSpec
from shared.domain.throttle import Limit, TokenBucket
from shared.waits import cancel_and_wait, sleep_unless, within

log = logging.getLogger("ferry.inbox_consumer")

#: Longest single sleep while waiting for a token: a rate raised meanwhile (or a stop)
#: is noticed at least this often even if no one wakes the waiter.
MAX_PAUSE = 1.0
#: What a read of the override table may raise that leaves the last limit in force.
READ_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, TimeoutError)
#: Default seconds between reads of the override table.
DEFAULT_POLL_INTERVAL = 2.0


def split(limit: Limit | None, members: int) -> Limit | None:
    """One of ``members`` processes' part of ``limit``: the rate divided, the burst too
    (at least one token)."""
    if limit is None or members <= 1:
        return limit
    return Limit(limit.rate / members, max(1, math.ceil(limit.burst / members)))


#: Polls between two reports of an unchanged circuit breaker state.
REPORT_EVERY = 15


class Throttle:
    """The rate limit in force for one durable in this process (shared by its partitions)."""

    def __init__(
        self,
        durable: str,
        spec: DurableSpec,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.durable, self.spec, self.clock = durable, spec, clock
        #: This process among the durable's consumers (``throttle_members``).
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: The topology's limit (None: not throttled unless an operator says so).
        self.default: Limit | None = spec.throttle.limit() if spec.throttle else None
        #: The operator's override in force (None: the topology's value applies).
        self.override: Override | None = None
        #: The durable's limit in force (None: unthrottled), shared by its processes.
        self.limit: Limit | None = self.default
        #: Live consumer processes of the durable, this one included (last poll).
        self.members = 1
        self.bucket = TokenBucket(self.default, clock())
        #: Seconds fetch loops waited for a token (ferry_throttle_wait_seconds_total).
        self.waited = 0.0
        self._changed = asyncio.Event()
        self._ignored_logged = False
        #: What else this process reports with its heartbeat: its circuit breaker's state
        #: and since when (:meth:`.breaker.CircuitBreaker.report`), for the console.
        self.circuit: Callable[[], tuple[str, datetime | None]] | None = None
        self._reported: tuple[str, datetime | None] | None = None
        self._polls = 0

    @property
    def share(self) -> Limit | None:
        """This process's part of the limit: the rate and burst split among the members."""
        return self.bucket.limit

    @property
    def source(self) -> str:
        """Where the limit in force comes from: ``override``, ``topology`` or ``none``."""
        if self.override is not None:
            return "override"
        return "topology" if self.default is not None else "none"

    def apply(self, override: Override | None, members: int | None = None) -> None:
        """Put ``override`` in force (None: back to the topology's value), shared among
        ``members`` processes (default: as many as last time)."""
        if override is not None and self.spec.criticality == "high":
            if not self._ignored_logged:
                log.error(
                    "ignoring a throttle override of %s: it is declared criticality: high "
                    "and is never throttled (clear it: ferry durable throttle --clear)",
                    self.durable,
                )
                self._ignored_logged = True
            override = None
        before = (self.source, self.limit, self.members)
        self.override = override
        self.limit = override.limit() if override is not None else self.default
        self.members = max(1, members or self.members)
        share = split(self.limit, self.members)
        if share != self.bucket.limit:
            self.bucket.set_limit(share, self.clock())
            self._changed.set()
        if (self.source, self.limit, self.members) != before:
            shown = self.limit.describe() if self.limit else "no limit"
            who = f" by {override.actor}: {override.reason}" if override else ""
            log.info("throttle of %s now %s (%s%s), shared by %d process(es)",
                     self.durable, shown, self.source, who, self.members)  # fmt: skip

    def window(self, batch_size: int) -> int:
        """Messages to keep requested from JetStream: the batch size unthrottled; else at
        most the burst and about half an ack_wait's worth, at least one."""
        limit = self.share
        if limit is None:
            return batch_size
        ahead = math.floor(limit.rate * self.spec.ack_wait / 2)
        return max(1, min(batch_size, limit.burst, ahead))

    async def admit(self, want: int, stop: asyncio.Event) -> int:
        """Wait for a token; how many of ``want`` messages may be fetched now (0: stopped)."""
        while not stop.is_set():
            now = self.clock()
            tokens = self.bucket.available(now)
            if tokens >= 1:
                return want if math.isinf(tokens) else max(1, min(want, math.floor(tokens)))
            pause = min(self.bucket.wait_for(1, now), MAX_PAUSE)
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({changed, stopped}, timeout=pause)
            finally:
                changed.cancel()
                stopped.cancel()
            self.waited += max(self.clock() - now, 0.0)
        return 0

    def spent(self, count: int) -> None:
        """``count`` messages were fetched: take their tokens."""
        self.bucket.take(count, self.clock())

    async def refresh(self, conn: Any, alive: float = 3 * DEFAULT_POLL_INTERVAL) -> None:
        """Mark this process alive; apply the override in force and the number of live
        processes (seen within ``alive`` seconds) sharing the limit."""
        override, members = await throttles.poll(conn, self.durable, self.owner, alive=alive)
        self.apply(override, members)
        self._polls += 1
        if self.circuit is not None:  # written when it changed, and now and then anyway
            report = self.circuit()
            if report != self._reported or self._polls % REPORT_EVERY == 1:
                try:
                    await circuits.report_circuit(conn, self.durable, self.owner, *report)
                except READ_ERRORS as exc:  # the console's view only: the throttle goes on
                    log.warning("circuit breaker state of %s not reported: %s", self.durable, exc)
                else:
                    self._reported = report

    async def watch(
        self, pool: Any, stop: asyncio.Event, interval: float = DEFAULT_POLL_INTERVAL
    ) -> None:
        """Apply the override table every ``interval`` seconds until ``stop``. While the
        database cannot be read, the limit last read stays in force."""
        failing = False
        while not stop.is_set():
            try:
                async with pool.acquire() as conn:
                    await self.refresh(conn, alive=3 * interval + 1.0)
                if failing:
                    log.info("throttle overrides of %s readable again", self.durable)
                failing = False
            except READ_ERRORS as exc:
                if not failing:
                    log.warning(
                        "cannot read the throttle overrides of %s (%s): the limit last read "
                        "stays in force",
                        self.durable,
                        exc,
                    )
                failing = True
            await sleep_unless(stop, interval)
        with contextlib.suppress(*READ_ERRORS):  # the others take the share at once
            async with pool.acquire() as conn:
                await within(5.0, throttles.leave(conn, self.durable, self.owner))

    @contextlib.asynccontextmanager
    async def watching(
        self, pool: Any, stop: asyncio.Event, interval: float = DEFAULT_POLL_INTERVAL
    ) -> AsyncIterator[None]:
        """:meth:`watch` while the block runs; on the way out (``stop`` set: the role is
        stopping) the watcher leaves ``throttle_members``, so the others take its share."""
        task = asyncio.create_task(self.watch(pool, stop, interval))
        try:
            yield
        finally:
            if stop.is_set():  # it leaves throttle_members, in a bounded statement
                await asyncio.wait({task}, timeout=interval + 6.0)
            await cancel_and_wait(task, interval + 6.0)

    def families(self) -> list[Metric]:
        """Its series (:func:`.metrics.throttle_families`)."""
        return throttle_families(self.durable, self.source, self.limit, self.members, self.waited)
