"""The publisher's behaviour: claim, publish pipelined, mark — over and over.

Each of ``concurrency`` workers loops: open a transaction, claim a batch (see
:mod:`shared.adapters.outbox`), publish it with many PubAcks in flight, mark the
acknowledged rows published and the failed ones failed, commit. How the rows are sent
is :mod:`.sending`'s: JetStream atomic batches where the stream allows them (see
:mod:`.atomic`); otherwise, and whenever the server refuses one, one by one in
per-aggregate waves, so a failed publish never lets a later event of the same aggregate
overtake it.
A crash anywhere before the commit leaves the rows unpublished; they are published again
with the same ``Nats-Msg-Id`` and JetStream drops the copy.

No row stops the publisher: whatever one row's build or publish raises is recorded on
that row (see :mod:`.failures` for when it is set aside), and whatever a batch raises is
logged, counted and retried after a back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Unpack

from services.outbox_publisher.metrics import PublisherMetrics
from services.outbox_publisher.stats import PublisherStats
from shared.adapters import outbox, outbox_set_aside
from shared.adapters.jetstream import JetStream
from shared.adapters.outbox import Failure
from shared.adapters.postgres import DATABASE_ERRORS, Conn, Pool
from shared.adapters.stores import PostgresOutboxStore
from shared.domain.pacing import ArrivalGap
from shared.domain.ports import OutboxRecord, OutboxStore
from shared.runtime.metrics import RoleMetrics
from shared.waits import sleep_unless, wait_any

from .messages import build_message, ordering_fields_of
from .sending import Sender, SendOptions
from .watch import OutboxWatch

__all__ = [
    "Batch",
    "OutboxPublisher",
    "PublisherStats",
    "build_message",
    "ordering_fields_of",
]

log = logging.getLogger("ferry.outbox_publisher")

#: An empty claim slower than this (s) walked many rows that all wait behind failing or
#: set-aside rows (a long outage over a large backlog): the worker then rests ten times
#: as long (at most SLOW_EMPTY_REST_MAX s) before it claims again, rather than at every
#: NOTIFY, so such claims take at most about a tenth of a database core per worker.
SLOW_EMPTY_CLAIM = 0.1
SLOW_EMPTY_REST_MAX = 10.0


class Batch(NamedTuple):
    """One batch's outcome: rows claimed to publish, of them failed (or set aside), and held
    back."""

    claimed: int
    failed: int
    held_back: int


class OutboxPublisher:
    """Publishes one context's outbox into its stream."""

    def __init__(
        self,
        *,
        pool: Pool,
        js: JetStream,
        context: str,
        namespace: str,
        stream: str,
        batch_size: int,
        publish_timeout: float,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
        metrics: PublisherMetrics | None = None,
        max_publish_attempts: int = 20,
        store: OutboxStore[Conn] | None = None,
        **sending: Unpack[SendOptions],
    ) -> None:
        self.pool, self.js = pool, js
        #: The outbox (the port; PostgreSQL's unless a test passes another). The commit
        #: goes with the published mark in one round trip, which the adapter alone offers
        #: (:func:`outbox.mark_published_and_commit`).
        self.store: OutboxStore[Conn] = store or PostgresOutboxStore()
        self.context, self.stream = context, stream
        self.batch_size = batch_size
        self.retry_initial, self.retry_max = retry_initial, retry_max
        #: Refusals after which a row is set aside.
        self.max_publish_attempts = max_publish_attempts
        self.stats = PublisherStats()
        self.metrics = metrics or PublisherMetrics(
            RoleMetrics("outbox-publisher"), context=context, stream=stream
        )
        #: Sends a claim's rows: atomic batches or per-aggregate waves (:mod:`.sending`).
        self.sender = Sender(
            js=js, context=context, namespace=namespace, stream=stream,
            publish_timeout=publish_timeout, stats=self.stats, metrics=self.metrics, **sending,
        )  # fmt: skip
        self._wakeups: list[asyncio.Event] = []
        #: Wake-ups of the workers waiting for work, longest-waiting first.
        self._idle: list[asyncio.Event] = []
        #: Wake-ups of the workers whose last claim found rows held back behind an earlier
        #: row of their aggregate in another worker's batch: that worker's commit wakes one.
        self._held_back: list[asyncio.Event] = []
        #: Seconds a woken worker waits before claiming, gathering commits into one batch
        #: — only while another worker is publishing (see :meth:`run_worker`).
        self.linger = 0.0
        #: Seconds a worker woken by a NOTIFY may wait, even with no other worker busy,
        #: while commits come less than this apart, so that a moderate rate fills
        #: batches; it claims early once enough commits were notified to fill one
        #: (see :meth:`_fill`). 0: only :attr:`linger` applies (the earlier behaviour).
        self.fill_linger = 0.0
        #: NOTIFYs seen so far, and the workers filling a batch: (count at which it is
        #: full, the event that ends its wait early).
        self._notified = 0
        self._filling: list[tuple[int, asyncio.Event]] = []
        #: Workers between their claim and their commit.
        self._publishing = 0
        #: The recent pace of commits (NOTIFY): lingering pays only when it is quick.
        self.arrivals = ArrivalGap()
        #: Batches committed with rows published, by any worker: a claim that found rows
        #: held back compares it with its value from before the claim (see run_worker).
        self._commits = 0
        #: Rows claimed so far, by any worker (the watch ends when they stop coming).
        self.claimed_rows = 0
        #: Claims on a timer while commits come quickly, sparing their NOTIFYs
        #: (:mod:`.watch`; set by the role, None: every commit notifies).
        self.watch: OutboxWatch | None = None

    @property
    def atomic_min_rows(self) -> int:
        """Claims smaller than this go one by one (see :mod:`.sending`)."""
        return self.sender.atomic_min_rows

    @atomic_min_rows.setter
    def atomic_min_rows(self, rows: int) -> None:
        self.sender.atomic_min_rows = rows

    def notify(self) -> None:
        """A commit with outbox rows happened (NOTIFY): wake one worker.

        One, not all: at a steady rate every commit notifies, and waking every worker
        made each claim for each commit — mostly empty claims, each a round trip and a run
        of the claim query. The longest-idle worker is woken; with none idle, a busy one
        is told to claim again when its batch ends, so no notification is lost.
        """
        self.arrivals.arrived()
        self._notified += 1
        if self.watch is not None:
            self.watch.arrived()
        if self._filling:
            # A worker is gathering commits into its coming claim: this one joins it, no
            # other worker need claim. When its batch is full it claims at once; later
            # commits wake another worker as usual.
            full_at, full = self._filling[-1]
            if self._notified < full_at:
                return
            if not full.is_set():
                full.set()
                return
        self.tick()

    def tick(self) -> None:
        """Wake one worker to claim: the longest-idle one, or else tell a busy one to claim
        again when its batch ends. A NOTIFY does this, and so does the outbox watch
        (:mod:`.watch`) on its timer while commits skip their NOTIFYs."""
        if self._idle:
            self._idle.pop(0).set()
        elif self._wakeups:
            self._wakeups[0].set()

    async def run_worker(self, stop: asyncio.Event, *, poll_interval: float) -> None:
        """Loop until ``stop``: publish batches while there are any, else wait for a wake-up."""
        delay = self.retry_initial
        wakeup = asyncio.Event()
        self._wakeups.append(wakeup)
        while not stop.is_set():
            # Cleared before the claim, so a commit that lands during it is not missed.
            wakeup.clear()
            commits_before = self._commits
            started = time.monotonic()
            batch = await self._batch_or_rest(stop, delay)
            if batch is None:
                delay = min(delay * 2, self.retry_max)
                continue
            count, failed, held_back = batch
            if failed:
                await sleep_unless(stop, delay)
                delay = min(delay * 2, self.retry_max)
            else:
                delay = self.retry_initial
            # Another worker committed while this claim ran: the rows it held back may be
            # free already, and that worker looked for held-back workers to wake before
            # this one could be among them. (No await between here and _wait_held_back's
            # registration of this worker.)
            others_committed = self._commits != commits_before
            if count > failed:
                self._commits += 1
                if self._held_back:
                    # This commit may have released rows another worker's claim held back.
                    self._held_back.pop(0).set()
            if held_back and not failed:
                # Rows wait behind an earlier row of their aggregate that another worker
                # is publishing (or that is failing): claim again after its commit (or
                # the poll), not after the next NOTIFY — a backlog has no new commits.
                await self._wait_held_back(wakeup, stop, poll_interval, others_committed)
                continue
            slow = time.monotonic() - started
            if count == 0 and slow > SLOW_EMPTY_CLAIM:
                await sleep_unless(stop, min(slow * 10, SLOW_EMPTY_REST_MAX))
            elif count < self.batch_size and not failed:
                await _wait_listed(wakeup, self._idle, stop, timeout=poll_interval)
                if wakeup.is_set():
                    await self._linger(stop)
        self._wakeups.remove(wakeup)

    async def _linger(self, stop: asyncio.Event) -> None:
        """After a NOTIFY woke this worker: wait for the commits right behind it, or not.

        Only while commits have lately come quicker than the linger — an isolated commit
        is claimed at once (and whatever the pace, it waits at most the linger). Never
        while the outbox is watched: the watch's period is the linger then.
        """
        if self.watch is not None and self.watch.watching:
            return
        if self.fill_linger and self.arrivals.expects_within(self.fill_linger):
            await self._fill(stop)
        elif self.linger and self._publishing and self.arrivals.expects_within(self.linger):
            # Another batch is on its way and commits come quickly: let those of the next
            # few milliseconds join this claim, turning one-row batches into batches.
            self.metrics.lingered("busy")
            await asyncio.sleep(self.linger)
        elif self.fill_linger or self.linger:
            self.metrics.lingered("none")

    async def _fill(self, stop: asyncio.Event) -> None:
        """Wait up to :attr:`fill_linger` for the commits that would fill a batch.

        Counted in NOTIFYs (one per committing transaction, which may hold several rows),
        so a batch of multi-row commits may be claimed only at the linger's end; the one
        that woke this worker counts as the first. A single filling worker at a time:
        the others' wake-ups join its batch (see :meth:`notify`).
        """
        full = asyncio.Event()
        entry = (self._notified + self.batch_size - 1, full)
        self._filling.append(entry)
        try:
            await wait_any(full, stop, timeout=self.fill_linger)
        finally:
            self._filling.remove(entry)
        self.metrics.lingered("full" if full.is_set() else "timeout")

    async def _batch_or_rest(self, stop: asyncio.Event, delay: float) -> Batch | None:
        """One batch; when it raises, log and count why and rest ``delay`` (None)."""
        try:
            return await self._publish_counted()
        except DATABASE_ERRORS as exc:
            self.stats.last_db_ok = False
            self._count_error(type(exc).__name__)
            log.warning("outbox batch failed: %s; retrying in %.1fs", exc, delay)
        except Exception as exc:  # a bug or a surprise: never let it end the worker
            self.stats.batch_errors += 1
            self._count_error(type(exc).__name__)
            log.exception("outbox batch raised %s; retrying in %.1fs", type(exc).__name__,
                          delay)  # fmt: skip
        await sleep_unless(stop, delay)
        return None

    async def sweep_waiting(
        self, stop: asyncio.Event, *, every: float = outbox_set_aside.WAITING_SWEEP_SECONDS
    ) -> None:
        """Until ``stop``: now and then take the rows committed behind a set-aside row out
        of the claim's walk (:meth:`OutboxStore.mark_waiting`). A failed sweep is logged
        and tried at the next period: it changes what a claim walks, never what it finds."""
        while not stop.is_set():
            try:
                async with self.pool.acquire() as conn:
                    changed = await self.store.mark_waiting(conn)
                if changed:
                    log.info("%d outbox rows marked or released behind set-aside rows", changed)
            except DATABASE_ERRORS as exc:
                log.warning("outbox sweep of rows behind set-aside rows failed: %s", exc)
            except Exception:  # a bug or a surprise: never let it end the role
                log.exception("outbox sweep of rows behind set-aside rows raised")
            await sleep_unless(stop, every)

    async def _wait_held_back(
        self, wakeup: asyncio.Event, stop: asyncio.Event, poll_interval: float, committed: bool
    ) -> None:
        """Wait for another worker's commit (or the poll) to free held-back rows.

        ``committed``: a commit already landed while the claim ran — claim again at once.
        """
        self.stats.held_back += 1
        if committed or await _wait_listed(wakeup, self._held_back, stop, timeout=poll_interval):
            self.stats.released += 1

    async def _publish_counted(self) -> Batch:
        self._publishing += 1
        try:
            batch = await self.publish_batch()
        finally:
            self._publishing -= 1
        self.claimed_rows += batch.claimed
        return batch

    async def publish_batch(self) -> Batch:
        """Claim, publish and mark one batch; return what it claimed, failed and held back.

        Three round trips: ``BEGIN``, the claim, ``UPDATE … ; COMMIT`` as one simple query
        (see :func:`outbox.mark_published_and_commit`), plus one per distinct error when
        rows failed. Anything raised before the commit rolls the claim back.
        """
        async with self.pool.acquire() as conn:
            await conn.execute(outbox.CLAIM_TRANSACTION)
            committed = False
            try:
                claimed = await self.store.claim(conn, self.batch_size)
                rows = claimed.rows
                self.stats.last_db_ok = True
                published: list[int] = []
                failures: dict[int, Failure] = {}
                set_aside: Mapping[int, str] = {}
                if rows:
                    published, failures = await self.publish_rows(rows)
                    set_aside = await self.store.mark_failed(
                        conn, failures, max_attempts=self.max_publish_attempts
                    )
                await outbox.mark_published_and_commit(conn, published)
                committed = True
            finally:
                if not committed and not conn.is_closed():
                    with contextlib.suppress(*DATABASE_ERRORS):
                        await conn.execute("ROLLBACK")
        if not rows:
            return Batch(0, 0, claimed.held_back)
        self.metrics.batch_claimed(len(rows))
        done = set(published)
        self.metrics.events_published(Counter(r.event_type for r in rows if r.seq in done))
        self.stats.batches += 1
        self.stats.published += len(published)
        self.stats.publish_errors += len(failures)
        if set_aside:
            self._report_set_aside(rows, failures, set_aside)
        return Batch(len(rows), len(failures), claimed.held_back)

    def _report_set_aside(
        self,
        rows: Sequence[OutboxRecord],
        failures: dict[int, Failure],
        set_aside: Mapping[int, str],
    ) -> None:
        self.stats.set_aside += len(set_aside)
        self.metrics.rows_set_aside(Counter(set_aside.values()))
        for row in rows:
            if row.seq in set_aside:
                log.error(
                    "outbox row set aside (%s): seq %d, id %s, %s %s/%s v%d: %s; its "
                    "aggregate's later rows wait behind it (ferry outbox list --failed)",
                    set_aside[row.seq], row.seq, row.id, row.aggregate_type, row.aggregate_id,
                    row.event_type, row.event_version, failures[row.seq].error,
                    extra={"reason_code": set_aside[row.seq], "message_id": str(row.id)},
                )  # fmt: skip

    async def publish_rows(
        self, rows: Sequence[OutboxRecord]
    ) -> tuple[list[int], dict[int, Failure]]:
        """Publish ``rows``; return (published seqs, failed seq → why) (:mod:`.sending`)."""
        return await self.sender.publish_rows(rows)

    def _count_error(self, kind: str) -> None:
        self.sender.count_error(kind)


async def _wait_listed(
    wakeup: asyncio.Event, waiters: list[asyncio.Event], stop: asyncio.Event, *, timeout: float
) -> bool:
    """Wait on ``waiters`` (where another worker finds ``wakeup`` and sets it) until woken,
    stopped or ``timeout``; True when another worker took it off the list to wake it."""
    waiters.append(wakeup)
    try:
        await wait_any(wakeup, stop, timeout=timeout)
    finally:
        taken = wakeup not in waiters
        if not taken:
            waiters.remove(wakeup)
    return taken
