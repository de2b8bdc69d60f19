"""How a claim's rows reach JetStream: atomic batches, or per-aggregate waves one by one.

:meth:`Sender.publish_rows` sends a claim as JetStream atomic batches where the stream
allows them (:mod:`.atomic`) and the claim holds at least ``atomic_min_rows``; otherwise,
and whenever the server refuses a batch, row by row in per-aggregate waves, so a failed
publish never lets a later event of the same aggregate overtake it. Whatever one row's
build or publish raises is returned as that row's :class:`Failure`, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections import OrderedDict, deque
from collections.abc import Sequence

from services.outbox_publisher.metrics import PublisherMetrics
from shared import telemetry
from shared.adapters.jetstream import JetStream, PubAck
from shared.adapters.outbox import Failure
from shared.domain.ordering import OrderingKeyError
from shared.domain.ports import OutboxRecord

from . import atomic
from . import failures as fail
from .messages import OrderingFields, build_message
from .stats import PublisherStats

log = logging.getLogger("ferry.outbox_publisher")

#: Seconds the publisher goes one by one after the stream answered that it takes no
#: atomic batches (no ``allow_atomic``, or a server before 2.12), before it tries again.
ATOMIC_RETRY_AFTER = 60.0


class SendOptions(typing.TypedDict, total=False):
    """How a :class:`Sender` sends, beyond its stream: the keywords the publisher takes and
    hands on (each defaults as :class:`Sender` says)."""

    max_message_bytes: int | None
    partitions: int
    ordering_fields: OrderingFields | None
    atomic_batches: bool
    atomic_min_rows: int
    nc: atomic.Client | None


class Sender:
    """Publishes claimed rows into one stream (the publisher's workers share one)."""

    def __init__(
        self,
        *,
        js: JetStream,
        context: str,
        namespace: str,
        stream: str,
        publish_timeout: float,
        stats: PublisherStats,
        metrics: PublisherMetrics,
        max_message_bytes: int | None = None,
        partitions: int = 1,
        ordering_fields: OrderingFields | None = None,
        atomic_batches: bool = True,
        atomic_min_rows: int = atomic.MIN_ROWS,
        nc: atomic.Client | None = None,
    ) -> None:
        self.js = js
        self.context, self.namespace, self.stream = context, namespace, stream
        self.publish_timeout = publish_timeout
        self.stats, self.metrics = stats, metrics
        #: The stream's max_msg_size (None: the server's answer decides).
        self.max_message_bytes = max_message_bytes
        #: The stream's partitions (the subject's last token when > 1) and each event's
        #: ordering-key field (from the topology's events).
        self.partitions, self.ordering_fields = partitions, dict(ordering_fields or {})
        #: Publish claims as atomic batches (see :mod:`.atomic`) through ``nc`` (default:
        #: the client ``js`` publishes through), until the stream says it takes none;
        #: then one by one for ATOMIC_RETRY_AFTER seconds.
        self.atomic_batches = atomic_batches
        #: Smaller claims go one by one (an atomic batch has a cost of its own).
        self.atomic_min_rows = atomic_min_rows
        self.nc: atomic.Client | None = nc or typing.cast(
            "atomic.Client | None", getattr(js, "_nc", None)
        )
        self._atomic_off_until = 0.0

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
                self.count_error(failure.kind)
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
            self.count_error("timeout")
            return fail.no_puback(self.publish_timeout)
        exc = future.exception()
        if exc is not None:
            self.count_error(type(exc).__name__)
            return fail.of_publish(exc)
        if future.result().duplicate:
            self.stats.duplicates += 1
        return None

    def count_error(self, kind: str) -> None:
        """Count a publish error of ``kind`` (stats and metric)."""
        self.stats.errors_by_kind[kind] = self.stats.errors_by_kind.get(kind, 0) + 1
        self.metrics.publish_error(kind)
