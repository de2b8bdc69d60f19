"""The outbox-publisher's instruments (see :mod:`shared.runtime.metrics` for the core)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from shared.adapters import outbox
from shared.runtime.metrics import (
    BATCH_BUCKETS,
    DESTINATION,
    ERROR,
    OPERATION,
    OPERATION_BUCKETS,
    SYSTEM,
    RoleMetrics,
    age_seconds,
)
from shared.telemetry import MESSAGING_SYSTEM


class PublisherMetrics:
    """outbox-publisher: sends, PubAck latency, EVT-047-001, errors, QRY-050."""

    def __init__(self, role: RoleMetrics, *, context: str, stream: str) -> None:
        reg, self.role, self.context = role.registry, role, context
        sent = Counter(
            "messaging_client_sent_messages",
            "Messages the publisher attempted to send (error_type set when it failed).",
            [SYSTEM, OPERATION, DESTINATION, ERROR],
            registry=reg,
        )
        duration = Histogram(
            "messaging_client_operation_duration_seconds",
            "Publish to PubAck, per message.",
            [SYSTEM, OPERATION, DESTINATION, ERROR],
            buckets=OPERATION_BUCKETS,
            registry=reg,
        )
        self._sent = sent
        self._duration = duration
        self._sent_ok = sent.labels(MESSAGING_SYSTEM, "publish", stream, "")
        self._duration_ok = duration.labels(MESSAGING_SYSTEM, "publish", stream, "")
        self._stream = stream
        self._published = Counter(
            "ferry_outbox_events_published",
            "EVT-047-001 OutboxEventPublished: outbox rows marked published (after commit).",
            ["context", "event_type"],
            registry=reg,
        )
        self._errors = Counter(
            "ferry_outbox_publish_errors",
            "Failed publishes and failed batches, by kind (timeout, exception, database).",
            ["context", "error_type"],
            registry=reg,
        )
        self._backlog = Gauge(
            "ferry_outbox_backlog", "QRY-050: unpublished outbox rows.", ["context"], registry=reg
        ).labels(context)
        self._oldest = Gauge(
            "ferry_outbox_oldest_age_seconds",
            "QRY-050: age of the oldest unpublished row's occurred_at (0 when none).",
            ["context"],
            registry=reg,
        ).labels(context)
        self._batch = Histogram(
            "ferry_outbox_batch_rows",
            "Rows per claimed batch (batches that found none are not counted): small batches "
            "at a steady rate mean each row pays a claim and a commit of its own.",
            ["context"],
            buckets=BATCH_BUCKETS,
            registry=reg,
        ).labels(context)
        linger = Counter(
            "ferry_outbox_linger",
            "Wake-ups by a NOTIFY, by what the worker did before claiming: full (waited "
            "until enough commits to fill a batch), timeout (waited the whole "
            "FERRY_PUBLISHER_LINGER), busy (waited FERRY_LINGER behind another worker's "
            "batch), none (claimed at once: commits not quick enough).",
            ["context", "outcome"],
            registry=reg,
        )
        self._linger = {
            outcome: linger.labels(context, outcome)
            for outcome in ("full", "timeout", "busy", "none")
        }
        atomic_batches = Counter(
            "ferry_outbox_atomic_batches",
            "Atomic batches sent, by outcome: stored (whole), refused (by the server, e.g. "
            "an event id already in the duplicate window after a crash: its rows then went "
            "one by one), unsupported (the stream lacks allow_atomic or the server is older "
            "than 2.12), outage (no answer: its rows are retried), error.",
            ["context", "outcome"],
            registry=reg,
        )
        self._atomic = {
            outcome: atomic_batches.labels(context, outcome)
            for outcome in ("stored", "refused", "unsupported", "outage", "error")
        }
        self._failing = Gauge(
            "ferry_outbox_failing",
            "Unpublished rows whose last publish attempt failed.",
            ["context"],
            registry=reg,
        ).labels(context)
        self._set_aside_now = Gauge(
            "ferry_outbox_set_aside",
            "Outbox rows set aside (cannot be published; their aggregate's later rows wait "
            "behind them) until an operator republishes them: ferry outbox list --failed.",
            ["context"],
            registry=reg,
        ).labels(context)
        self._set_aside = Counter(
            "ferry_outbox_rows_set_aside",
            "Outbox rows this publisher set aside, by reason code (PAYLOAD_INVALID, "
            "MESSAGE_TOO_LARGE, PUBLISH_REFUSED, ORDERING_KEY_MISSING).",
            ["context", "reason"],
            registry=reg,
        )

        self._watching = Gauge(
            "ferry_outbox_watching",
            "1 while the publisher claims on a timer and producers' commits skip their "
            "NOTIFY (steady traffic; table outbox_watch), 0 while each commit notifies.",
            ["context"],
            registry=reg,
        ).labels(context)
        self._watches = Counter(
            "ferry_outbox_watches",
            "Times the publisher started watching the outbox (commits came quicker than "
            "its linger apart).",
            ["context"],
            registry=reg,
        ).labels(context)

    def watching(self, on: bool) -> None:
        """The outbox watch started (counted) or ended, its claims after it included."""
        if on:
            self._watches.inc()
        self._watching.set(1 if on else 0)

    def time_send(self, future: asyncio.Future[Any]) -> None:
        """Count and time one pipelined publish when its PubAck (or failure) arrives."""
        started = time.perf_counter()

        def done(fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                error = "timeout"
            else:
                exc = fut.exception()
                error = "" if exc is None else type(exc).__name__
            self._observe_send(time.perf_counter() - started, error)

        future.add_done_callback(done)

    def batch_sent(self, count: int, seconds: float | None, error: str) -> None:
        """``count`` messages sent in one atomic batch, stored (or not) after ``seconds``."""
        for _ in range(count):
            self._observe_send(seconds, error)

    def atomic_batch(self, outcome: str) -> None:
        """One atomic batch: stored, refused, unsupported, outage or error."""
        self._atomic[outcome].inc()

    def send_failed(self, error_type: str) -> None:
        """A publish that failed before it was sent."""
        self._observe_send(None, error_type)

    def _observe_send(self, seconds: float | None, error: str) -> None:
        if not error:
            self._sent_ok.inc()
            if seconds is not None:
                self._duration_ok.observe(seconds)
            return
        self._sent.labels(MESSAGING_SYSTEM, "publish", self._stream, error).inc()
        if seconds is not None:
            self._duration.labels(MESSAGING_SYSTEM, "publish", self._stream, error).observe(seconds)

    def events_published(self, by_type: Mapping[str, int]) -> None:
        """EVT-047-001 for rows just committed as published."""
        for event_type, count in by_type.items():
            self._published.labels(self.context, event_type).inc(count)

    def batch_claimed(self, rows: int) -> None:
        """One batch of ``rows`` claimed (> 0) to publish."""
        self._batch.observe(rows)

    def lingered(self, outcome: str) -> None:
        """A NOTIFY wake-up's wait before its claim: full, timeout, busy or none."""
        self._linger[outcome].inc()

    def publish_error(self, kind: str) -> None:
        """One failed publish or batch."""
        self._errors.labels(self.context, kind).inc()

    def rows_set_aside(self, by_reason: Mapping[str, int]) -> None:
        """Rows just set aside (after commit), by reason code."""
        for reason, count in by_reason.items():
            self._set_aside.labels(self.context, reason).inc(count)

    def watch_outbox(self, pool: Any) -> None:
        """Refresh the QRY-050 gauges from ``pool`` at scrape time."""

        async def refresh() -> None:
            async with pool.acquire() as conn:
                doc = await outbox.backlog(conn)
            self._backlog.set(doc["count"])
            self._oldest.set(age_seconds(doc["oldest_at"]))
            self._failing.set(doc["failing"])
            self._set_aside_now.set(doc["set_aside"])

        self.role.add_refresher("outbox", refresh)
