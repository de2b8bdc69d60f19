"""The publisher's behaviour: claim, publish pipelined, mark — over and over.

Each of ``concurrency`` workers loops: open a transaction, claim a batch (see
:mod:`shared.adapters.outbox`), publish it with many PubAcks in flight, mark the
acknowledged rows published and the failed ones failed, commit. A batch goes out as
JetStream atomic batches where the stream allows them (see :mod:`.atomic`); otherwise,
and whenever the server refuses one, rows are published one by one in per-aggregate
waves, so a failed publish never lets a later event of the same aggregate overtake it.
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
import typing
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import asyncpg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from services.outbox_publisher.metrics import PublisherMetrics
from shared import telemetry
from shared.adapters import outbox
from shared.adapters.outbox import Failure
from shared.adapters.postgres import DATABASE_ERRORS, Conn
from shared.adapters.stores import PostgresOutboxStore
from shared.domain.ordering import (
    OrderingKeyError,
)
from shared.domain.pacing import ArrivalGap
from shared.domain.ports import OutboxRecord, OutboxStore
from shared.runtime.metrics import RoleMetrics

from . import atomic
from . import failures as fail
from .messages import OrderingFields, build_message, ordering_fields_of

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
#: Seconds the publisher goes one by one after the stream answered that it takes no
#: atomic batches (no ``allow_atomic``, or a server before 2.12), before it tries again.
ATOMIC_RETRY_AFTER = 60.0


@dataclass
class PublisherStats:
    """Counters the role exposes (and tests read)."""

    published: int = 0
    duplicates: int = 0
    publish_errors: int = 0
    #: Rows this process set aside, and batches that raised something unexpected.
    set_aside: int = 0
    batch_errors: int = 0
    batches: int = 0
    #: Claims that found rows held back behind another worker's batch, and waits for such
    #: rows that another worker's commit ended (rather than the poll).
    held_back: int = 0
    released: int = 0
    #: Atomic batches stored whole, and refused (their rows then went one by one).
    atomic_batches: int = 0
    atomic_refused: int = 0
    last_db_ok: bool = False
    errors_by_kind: dict[str, int] = field(default_factory=dict)


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
        pool: asyncpg.Pool,
        js: JetStreamContext,
        context: str,
        namespace: str,
        stream: str,
        batch_size: int,
        publish_timeout: float,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
        metrics: PublisherMetrics | None = None,
        max_publish_attempts: int = 20,
        max_message_bytes: int | None = None,
        store: OutboxStore[Conn] | None = None,
        partitions: int = 1,
        ordering_fields: OrderingFields | None = None,
        atomic_batches: bool = True,
        atomic_min_rows: int = atomic.MIN_ROWS,
        nc: atomic.Client | None = None,
    ) -> None:
        self.pool, self.js = pool, js
        #: Publish claimed batches as atomic batches (see :mod:`.atomic`) through ``nc``
        #: (default: the client ``js`` publishes through), until the stream says it
        #: takes none; then one by one for ATOMIC_RETRY_AFTER seconds.
        self.atomic_batches = atomic_batches
        #: Smaller claims go one by one (an atomic batch has a cost of its own).
        self.atomic_min_rows = atomic_min_rows
        self.nc: atomic.Client | None = nc or typing.cast(
            "atomic.Client | None", getattr(js, "_nc", None)
        )
        self._atomic_off_until = 0.0
        #: The outbox (the port; PostgreSQL's unless a test passes another). The commit
        #: goes with the published mark in one round trip, which the adapter alone offers
        #: (:func:`outbox.mark_published_and_commit`).
        self.store: OutboxStore[Conn] = store or PostgresOutboxStore()
        self.context, self.namespace, self.stream = context, namespace, stream
        self.batch_size, self.publish_timeout = batch_size, publish_timeout
        self.retry_initial, self.retry_max = retry_initial, retry_max
        #: Refusals after which a row is set aside; the stream's max_msg_size (None: the
        #: server's answer decides).
        self.max_publish_attempts, self.max_message_bytes = max_publish_attempts, max_message_bytes
        #: The stream's partitions (the subject's last token when > 1) and each event's
        #: ordering-key field (from the topology's events).
        self.partitions, self.ordering_fields = partitions, dict(ordering_fields or {})
        self.stats = PublisherStats()
        self.metrics = metrics or PublisherMetrics(
            RoleMetrics("outbox-publisher"), context=context, stream=stream
        )
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

    def notify(self) -> None:
        """A commit with outbox rows happened (NOTIFY): wake one worker.

        One, not all: at a steady rate every commit notifies, and waking every worker
        made each claim for each commit — mostly empty claims, each a round trip and a run
        of the claim query. The longest-idle worker is woken; with none idle, a busy one
        is told to claim again when its batch ends, so no notification is lost.
        """
        self.arrivals.arrived()
        self._notified += 1
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
                await _sleep_unless(stop, delay)
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
                await _sleep_unless(stop, min(slow * 10, SLOW_EMPTY_REST_MAX))
            elif count < self.batch_size and not failed:
                await _wait_listed(wakeup, self._idle, stop, timeout=poll_interval)
                if wakeup.is_set():
                    await self._linger(stop)
        self._wakeups.remove(wakeup)

    async def _linger(self, stop: asyncio.Event) -> None:
        """After a NOTIFY woke this worker: wait for the commits right behind it, or not.

        Only while commits have lately come quicker than the linger — an isolated commit
        is claimed at once (and whatever the pace, it waits at most the linger).
        """
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
            await _wait_any(full, stop, timeout=self.fill_linger)
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
        await _sleep_unless(stop, delay)
        return None

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
            return await self.publish_batch()
        finally:
            self._publishing -= 1

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
        """Publish ``rows`` in per-aggregate waves; return (published seqs, failed seq → why).

        A row whose predecessor in its aggregate failed is not attempted at all: it stays
        pending, unmarked, behind the failed one. Atomic batches go first when on and
        the claim holds at least ``atomic_min_rows``: rows they stored are published; the
        rest go in waves.
        """
        stored: list[int] = []
        if self._atomic_on() and len(rows) >= self.atomic_min_rows:
            stored, failed = await self._publish_atomic(rows)
            if failed is not None or len(stored) == len(rows):
                return stored, failed or {}
            rows = rows[len(stored) :]
        queues: OrderedDict[tuple[str, str], deque[OutboxRecord]] = OrderedDict()
        for row in rows:
            queues.setdefault(row.aggregate, deque()).append(row)
        published: list[int] = stored
        failures: dict[int, Failure] = {}
        while queues:
            wave = [queue[0] for queue in queues.values()]
            results = await self._publish_wave(wave)
            for row, error in zip(wave, results, strict=True):
                queue = queues[row.aggregate]
                if error is None:
                    published.append(row.seq)
                    queue.popleft()
                    if not queue:
                        del queues[row.aggregate]
                else:
                    failures[row.seq] = error
                    del queues[row.aggregate]
        return published, failures

    async def _publish_atomic(
        self, rows: Sequence[OutboxRecord]
    ) -> tuple[list[int], dict[int, Failure] | None]:
        """Publish ``rows`` as consecutive atomic batches; return the seqs stored and, when
        JetStream did not answer, the failure of every other row (None: they go in waves).

        A row that cannot be built or is too large sends the whole claim to the waves,
        which record what is wrong with it and hold back only its aggregate.
        """
        messages: list[atomic.Message] = []
        for row in rows:
            try:
                message = build_message(
                    row,
                    namespace=self.namespace,
                    context=self.context,
                    partitions=self.partitions,
                    ordering_fields=self.ordering_fields,
                )
            except Exception:  # the waves build it again and record why it fails
                return [], None
            if self.max_message_bytes is not None:
                wire = {**message[2], "Nats-Expected-Stream": self.stream}
                size = fail.wire_size(message[1], wire)
                if size > self.max_message_bytes:
                    return [], None
            messages.append(message)
        spans = [
            self._send_span(row, subject, headers)
            for row, (subject, _, headers) in zip(rows, messages, strict=True)
        ]
        assert self.nc is not None
        stored, why, outage = 0, None, None
        for part in atomic.chunks(messages):
            started = time.perf_counter()
            try:
                refused = await atomic.publish(
                    self.nc, messages[part.start : part.stop], stream=self.stream,
                    timeout=self.publish_timeout,
                )  # fmt: skip
            except Exception as exc:  # recorded on the rows, never raised
                failure = fail.of_publish(exc)
                self._count_error(failure.kind)
                self.metrics.batch_sent(len(part), None, failure.kind)
                self.metrics.atomic_batch("outage" if failure.outage else "error")
                why, outage = failure.error, failure if failure.outage else None
                break
            if refused is not None:
                self._atomic_refused(refused, len(part))
                why = f"atomic batch refused: {refused.reason}"
                break
            self.stats.atomic_batches += 1
            self.metrics.atomic_batch("stored")
            self.metrics.batch_sent(len(part), time.perf_counter() - started, "")
            stored = part.stop
        for index, span in enumerate(spans):
            telemetry.end_span(span, why if index >= stored else None)
        published = [row.seq for row in rows[:stored]]
        if outage is None:
            return published, None
        return published, {row.seq: outage for row in rows[stored:]}

    def _atomic_on(self) -> bool:
        return (
            self.atomic_batches
            and self.nc is not None
            and time.monotonic() >= self._atomic_off_until
        )

    def _atomic_refused(self, refused: atomic.Refused, count: int) -> None:
        """Count a refused atomic batch; a stream that takes none is left alone for a while."""
        self.stats.atomic_refused += 1
        self.metrics.atomic_batch("unsupported" if refused.unsupported else "refused")
        if refused.unsupported:
            self._atomic_off_until = time.monotonic() + ATOMIC_RETRY_AFTER
            log.warning(
                "stream %s takes no atomic batches (%s): publishing one by one for %.0f s; "
                "`ferry provision` sets allow_atomic on it (nats-server 2.12+)",
                self.stream, refused.reason, ATOMIC_RETRY_AFTER,
            )  # fmt: skip
            return
        log.info(
            "atomic batch of %d rows refused (%s): publishing them one by one",
            count, refused.reason,
        )  # fmt: skip

    async def _publish_wave(self, wave: list[OutboxRecord]) -> list[Failure | None]:
        """Publish every row of ``wave`` pipelined; None for success, else why it failed."""
        futures: list[asyncio.Future[PubAck] | None] = []
        errors: list[Failure | None] = []
        spans: list[telemetry.Span | None] = []
        for row in wave:
            span = None
            future, error = None, None
            try:
                span, future, error = await self._send(row)
            except Exception as exc:  # any failure is recorded on the row, never raised
                error = fail.of_publish(exc)
            if error is not None:
                self.metrics.send_failed(error.kind)
            futures.append(future)
            errors.append(error)
            spans.append(span)
        live = [f for f in futures if f is not None]
        if live:
            _, pending = await asyncio.wait(live, timeout=self.publish_timeout)
            for future in pending:
                future.cancel()
        outcomes = [
            err if fut is None else self._outcome(fut)
            for fut, err in zip(futures, errors, strict=True)
        ]
        for span, outcome in zip(spans, outcomes, strict=True):
            telemetry.end_span(span, outcome.error if outcome else None)
        return outcomes

    async def _send(
        self, row: OutboxRecord
    ) -> tuple[telemetry.Span | None, asyncio.Future[PubAck] | None, Failure | None]:
        """Build ``row``'s message, check its wire size and publish it (not awaiting the
        PubAck); a row that cannot be built or is too large is not sent."""
        try:
            subject, body, headers = build_message(
                row,
                namespace=self.namespace,
                context=self.context,
                partitions=self.partitions,
                ordering_fields=self.ordering_fields,
            )
        except OrderingKeyError as exc:
            return None, None, fail.no_ordering_key(exc)
        except Exception as exc:  # RecursionError, ValueError, … whatever the row holds
            return None, None, fail.unbuildable(exc)
        if self.max_message_bytes is not None:
            size = fail.wire_size(body, {**headers, "Nats-Expected-Stream": self.stream})
            if size > self.max_message_bytes:
                return None, None, fail.too_large(size, self.max_message_bytes)
        span = self._send_span(row, subject, headers)
        future = await self.js.publish_async(subject, body, headers=headers, stream=self.stream)
        self.metrics.time_send(future)
        return span, future, None

    def _send_span(
        self, row: OutboxRecord, subject: str, headers: dict[str, str]
    ) -> telemetry.Span | None:
        """The row's ``publish`` span, child of its ``create``; its context goes in ``headers``.

        Most rows are unsampled: their ``headers`` already hold the traceparent a span
        would inject, so none is built (about 12 µs a row on the project's VM).
        """
        if not telemetry.active() or telemetry.passes_unchanged(row.traceparent):
            return None
        span = telemetry.start_span(
            f"publish {subject}",
            kind=telemetry.SpanKind.PRODUCER,
            parent=telemetry.remote_context(row.traceparent, row.tracestate),
            attributes=lambda: telemetry.messaging_attributes(
                operation_type="send",
                operation_name="publish",
                destination=subject,
                message_id=str(row.id),
                extra={"ferry.stream": self.stream, "ferry.outbox.seq": row.seq},
            ),
        )
        telemetry.inject(headers, span)
        return span

    def _outcome(self, future: asyncio.Future[PubAck]) -> Failure | None:
        if future.cancelled():
            self._count_error("timeout")
            return fail.no_puback(self.publish_timeout)
        exc = future.exception()
        if exc is not None:
            self._count_error(type(exc).__name__)
            return fail.of_publish(exc)
        if future.result().duplicate:
            self.stats.duplicates += 1
        return None

    def _count_error(self, kind: str) -> None:
        self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
        self.metrics.publish_error(kind)


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return


async def _wait_listed(
    wakeup: asyncio.Event, waiters: list[asyncio.Event], stop: asyncio.Event, *, timeout: float
) -> bool:
    """Wait on ``waiters`` (where another worker finds ``wakeup`` and sets it) until woken,
    stopped or ``timeout``; True when another worker took it off the list to wake it."""
    waiters.append(wakeup)
    try:
        await _wait_any(wakeup, stop, timeout=timeout)
    finally:
        taken = wakeup not in waiters
        if not taken:
            waiters.remove(wakeup)
    return taken


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
