"""Prometheus metrics of every role, served on ``/metrics`` beside /healthz and /readyz.

Names follow the OpenTelemetry messaging semantic conventions where they define one
(``messaging.client.sent.messages`` → ``messaging_client_sent_messages_total``, attribute
names with dots → underscores, as OpenTelemetry's own Prometheus exporter writes them);
the rest are ``ferry_*``. Each role process has one registry (:class:`RoleMetrics`) with
the process collectors (CPU, memory, GC); each role class owns its instruments and adds
them there. Counters that a role's stats already count exactly are read from the stats
at scrape time (no work on the hot path); gauges that need a query (backlogs, lag,
dead-letter states) are refreshed at scrape time, at most every
``FERRY_METRICS_REFRESH_INTERVAL`` seconds. The table of every series is in README.md
("Observability").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import prometheus_client
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.adapters import inbox, outbox
from shared.domain.ack import HandlerFailure, HandlerResponse
from shared.runtime.readiness import ReadinessCheck, run_checks
from shared.telemetry import otel as telemetry
from shared.telemetry.otel import MESSAGING_SYSTEM

log = logging.getLogger("ferry.metrics")

# One series per counter, not two: the *_created companions only add noise here.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: Semantic-convention attribute names as Prometheus labels.
SYSTEM, OPERATION, DESTINATION, GROUP, ERROR = (
    "messaging_system",
    "messaging_operation_name",
    "messaging_destination_name",
    "messaging_consumer_group_name",
    "error_type",
)
#: Seconds: a PubAck or a handler call (1 ms ... 1 min).
OPERATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Seconds from occurred_at to processed: milliseconds normally, minutes under retries.
END_TO_END_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
#: Messages in one batch: a claim of outbox rows, or one fetch of the consumer (1 ... 10,000).
BATCH_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
#: Longest a refresh (one query or JetStream request) may take before it is skipped.
REFRESH_TIMEOUT = 5.0

Refresher = Callable[[], Awaitable[None]]


class _FunctionCollector(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class RoleMetrics:
    """The Prometheus registry of one role process, and what refreshes its gauges."""

    def __init__(self, role: str, *, refresh_interval: float = 5.0) -> None:
        self.role = role
        self.refresh_interval = refresh_interval
        self.registry = CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.registry)
        prometheus_client.PlatformCollector(registry=self.registry)
        prometheus_client.GCCollector(registry=self.registry)
        Gauge("ferry_role_info", "The role this process runs.", ["role"], registry=self.registry)\
            .labels(role).set(1)  # fmt: skip
        self._refreshers: list[tuple[str, Refresher]] = []
        self._last_refresh: float | None = None
        self._lock = asyncio.Lock()
        self._refresh_errors = Counter(
            "ferry_metrics_refresh_errors",
            "Refreshes of query-backed gauges that failed (the gauges keep their last values).",
            ["source"],
            registry=self.registry,
        )
        self._ready = Gauge(
            "ferry_ready", "1 while the readiness check passes (see /readyz).", ["check"],
            registry=self.registry,
        )  # fmt: skip

    def add_refresher(self, source: str, refresher: Refresher) -> None:
        """Run ``refresher`` (bounded, errors counted) before a scrape renders."""
        self._refreshers.append((source, refresher))

    def add_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Families computed at scrape time (e.g. from a role's stats)."""
        self.registry.register(_FunctionCollector(collect))

    def watch_readiness(self, checks: Mapping[str, ReadinessCheck]) -> None:
        """Export each readiness check as ``ferry_ready{check}``."""
        async def refresh() -> None:
            for name, ok in (await run_checks(dict(checks))).items():
                self._ready.labels(name).set(1 if ok else 0)

        self.add_refresher("readiness", refresh)

    async def refresh(self) -> None:
        """Run the refreshers unless they ran less than ``refresh_interval`` ago."""
        async with self._lock:
            now = time.monotonic()
            if self._last_refresh is not None and now - self._last_refresh < self.refresh_interval:
                return
            for source, refresher in self._refreshers:
                try:
                    await asyncio.wait_for(refresher(), timeout=REFRESH_TIMEOUT)
                except Exception as exc:  # a gauge source down must not fail the scrape
                    self._refresh_errors.labels(source).inc()
                    log.warning("metrics refresh of %s failed: %s", source, exc)
            self._last_refresh = time.monotonic()

    async def render(self) -> tuple[bytes, str]:
        """The exposition text (refreshed first) and its content type."""
        await self.refresh()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _age(oldest: str | datetime | None) -> float:
    if oldest is None:
        return 0.0
    moment = datetime.fromisoformat(oldest) if isinstance(oldest, str) else oldest
    return max((datetime.now(UTC) - moment).total_seconds(), 0.0)


def _counter(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family


# --------------------------------------------------------------------------- publisher


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
            "MESSAGE_TOO_LARGE, PUBLISH_REFUSED).",
            ["context", "reason"],
            registry=reg,
        )

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
            self._oldest.set(_age(doc["oldest_at"]))
            self._failing.set(doc["failing"])
            self._set_aside_now.set(doc["set_aside"])

        self.role.add_refresher("outbox", refresh)


# --------------------------------------------------------------------------- consumer


class ConsumerMetrics:
    """inbox-consumer: receives, processing and end-to-end latency, outcomes, backlog, lag."""

    def __init__(self, role: RoleMetrics, *, durable: str, stream: str) -> None:
        reg, self.role, self.durable, self.stream = role.registry, role, durable, stream
        self._process = Histogram(
            "messaging_process_duration_seconds",
            "Handler call duration (error_type: HTTP status of a failure, timeout, unreachable).",
            [SYSTEM, OPERATION, DESTINATION, GROUP, ERROR],
            buckets=OPERATION_BUCKETS,
            registry=reg,
        )
        self._process_ok = self._process.labels(MESSAGING_SYSTEM, "process", stream, durable, "")
        self._responses = Counter(
            "ferry_handler_responses",
            "Handler answers by HTTP status (or timeout / unreachable).",
            ["durable", "status"],
            registry=reg,
        )
        self._end_to_end = Histogram(
            "ferry_end_to_end_latency_seconds",
            "occurred_at to processed (inbox marked, message acked), per processed message.",
            ["durable"],
            buckets=END_TO_END_BUCKETS,
            registry=reg,
        ).labels(durable)
        self._dead_letters = dead_letter_counter(reg)
        self._batch = Histogram(
            "ferry_consumer_batch_messages",
            "Messages per fetched batch (one inbox claim and one processed mark each).",
            ["durable"],
            buckets=BATCH_BUCKETS,
            registry=reg,
        ).labels(durable)
        self._backlog = Gauge(
            "ferry_inbox_backlog",
            "QRY-051: inbox rows without processed_at, by state (pending = received or "
            "processing; failed = dead-lettered).",
            ["durable", "state"],
            registry=reg,
        )
        self._oldest = Gauge(
            "ferry_inbox_oldest_age_seconds",
            "QRY-051: age of the oldest unprocessed row's received_at (0 when none).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._lag = Gauge(
            "ferry_consumer_lag_messages",
            "Consumer lag: JetStream num_pending + num_ack_pending of the durable.",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._pending = Gauge(
            "ferry_consumer_pending_messages",
            "JetStream's view of the durable: pending (not yet delivered) and ack_pending.",
            ["durable", "state"],
            registry=reg,
        )
        self._lag_seconds = Gauge(
            "ferry_consumer_lag_seconds",
            "Age of the oldest message the durable has not yet delivered (0 when none).",
            ["durable"],
            registry=reg,
        ).labels(durable)
        self._errors = Counter(
            "ferry_consumer_errors",
            "Messages the consumer could not settle as decided and nak'ed or dead-lettered "
            "instead (stage: dead_letter = record not written, e.g. no stream leader; "
            "decide/settle/batch = an unexpected exception).",
            ["durable", "stage"],
            registry=reg,
        )

    def batch_fetched(self, messages: int) -> None:
        """One batch of ``messages`` handed over by the puller."""
        self._batch.observe(messages)

    def handled(self, outcome: Any, seconds: float) -> None:
        """One handler call and what it answered."""
        if isinstance(outcome, HandlerResponse):
            status = str(outcome.status)
            error = "" if outcome.status < 400 or outcome.status == 409 else f"HTTP_{status}"
        elif isinstance(outcome, HandlerFailure):
            status = error = f"handler_{outcome.kind}"
        else:
            status = error = type(outcome).__name__
        self._responses.labels(self.durable, status).inc()
        if error:
            self._process.labels(MESSAGING_SYSTEM, "process", self.stream, self.durable, error)\
                .observe(seconds)  # fmt: skip
        else:
            self._process_ok.observe(seconds)

    def processed(self, occurred_at: datetime | None) -> None:
        """End-to-end latency of a message just processed."""
        if occurred_at is not None:
            self._end_to_end.observe(max(_age(occurred_at), 0.0))

    def dead_lettered(self, reason: str) -> None:
        """A dead letter this consumer recorded (direct path)."""
        self._dead_letters.labels(self.durable, reason, "consumer").inc()

    def consumer_error(self, stage: str) -> None:
        """A message whose settlement failed at ``stage`` (it was nak'ed or dead-lettered)."""
        self._errors.labels(self.durable, stage).inc()

    def watch(self, consumer: Any) -> None:
        """Export ``consumer.stats`` and refresh backlog and lag from its pool and js."""
        durable, stream = self.durable, self.stream
        self.role.add_collector(lambda: consumer_families(durable, stream, consumer.stats))
        self.role.add_refresher("inbox", lambda: self._refresh_inbox(consumer.pool))
        self.role.add_refresher("jetstream", lambda: self._refresh_lag(consumer.js))

    async def _refresh_inbox(self, pool: Any) -> None:
        async with pool.acquire() as conn:
            doc = await inbox.backlog(conn, self.durable)
        pending = doc["count"] - doc["retrying"] - doc["failed"]
        for state, value in (("pending", pending), ("retrying", doc["retrying"]),
                             ("failed", doc["failed"])):  # fmt: skip
            self._backlog.labels(self.durable, state).set(value)
        self._oldest.set(_age(doc["oldest_at"]))

    async def _refresh_lag(self, js: Any) -> None:
        info = await js.consumer_info(self.stream, self.durable)
        pending, ack_pending = info.num_pending or 0, info.num_ack_pending or 0
        self._pending.labels(self.durable, "pending").set(pending)
        self._pending.labels(self.durable, "ack_pending").set(ack_pending)
        self._lag.set(pending + ack_pending)
        self._lag_seconds.set(await oldest_undelivered_age(js, info) if pending else 0.0)


async def oldest_undelivered_age(js: Any, info: Any) -> float:
    """Seconds since the first message after the durable's last delivered one was stored."""
    from nats.js.errors import NotFoundError

    config = info.config
    filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
    start = (info.delivered.stream_seq if info.delivered else 0) + 1
    oldest: datetime | None = None
    for subject in filters:
        try:
            msg = await js.get_msg(info.stream_name, seq=start, subject=subject, next=True)
        except NotFoundError:
            continue
        if msg.time is not None and (oldest is None or msg.time < oldest):
            oldest = msg.time
    return _age(oldest)


def consumer_families(durable: str, stream: str, stats: Any) -> list[Metric]:
    """The consumer's exact counts (its stats) as Prometheus families."""
    outcomes = {
        "processed": stats.processed,
        "duplicate": stats.duplicates,
        "retried": stats.retries,
        "dead_lettered": stats.dead_lettered,
        "exhausted": stats.exhausted,
        "contended": stats.contended,
    }
    bound = GaugeMetricFamily(
        "ferry_consumer_bound", "1 once the consumer is bound to its durable.", labels=["durable"]
    )
    bound.add_metric([durable], 1 if stats.bound else 0)
    consumed = CounterMetricFamily(
        "messaging_client_consumed_messages",
        "Messages fetched from the durable (every delivery, redeliveries included).",
        labels=[SYSTEM, OPERATION, DESTINATION, GROUP],
    )
    consumed.add_metric([MESSAGING_SYSTEM, "fetch", stream, durable], stats.fetched)
    return [
        consumed,
        _counter(
            "ferry_consumer_messages",
            "Deliveries by outcome. Success ratio = (processed + duplicate) / (processed + "
            "duplicate + retried + dead_lettered + exhausted); contended = left to the copy "
            "holding the lease.",
            ["durable", "outcome"],
            {(durable, k): v for k, v in outcomes.items()},
        ),
        _counter(
            "ferry_consumer_retries",
            "Deliveries nak'ed for a retry, by reason code (HTTP_503, handler_timeout, ...).",
            ["durable", "reason"],
            {(durable, k): v for k, v in stats.retries_by_reason.items()},
        ),
        _counter(
            "ferry_consumer_duplicates_skipped",
            "Deliveries of an id whose outcome was already final: acked, handler not called.",
            ["durable"],
            {(durable,): stats.duplicates},
        ),
        _counter(
            "ferry_handler_config_alerts",
            "Handler answers that mean a configuration problem (e.g. 401, 404): alert, no ack.",
            ["durable"],
            {(durable,): stats.alerts},
        ),
        bound,
    ]


def dead_letter_counter(registry: CollectorRegistry) -> Counter:
    """``ferry_dead_letters_total{durable,reason,source}``: one per dead letter recorded.

    The consumer counts its direct path, the dlq-router the advisory path; sum both.
    """
    return Counter(
        "ferry_dead_letters",
        "Dead letters recorded (EVT-047-002), by durable, reason code and path.",
        ["durable", "reason", "source"],
        registry=registry,
    )


# --------------------------------------------------------------------------- dlq roles


class RouterMetrics:
    """dlq-router: advisories by outcome, dead letters recorded."""

    def __init__(self, role: RoleMetrics) -> None:
        self.role = role
        self._dead_letters = dead_letter_counter(role.registry)

    def dead_lettered(self, durable: str, reason: str, source: str) -> None:
        """A dead letter the router recorded."""
        self._dead_letters.labels(durable, reason, source).inc()

    def watch(self, router: Any) -> None:
        """Export ``router.stats`` and its sweep's."""
        self.role.add_collector(lambda: router_families(router.stats))
        self.role.add_collector(lambda: sweep_families(router.sweep.stats))


def router_families(stats: Any) -> list[Metric]:
    """The router's exact counts as Prometheus families."""
    outcomes = {
        "recorded": stats.recorded,
        "already": stats.already,
        "processed_late": stats.processed_late,
        "waiting": stats.waiting,
        "error": stats.errors,
        "invalid": stats.invalid,
        "failed": stats.failed,
    }
    bound = GaugeMetricFamily(
        "ferry_dlq_router_bound", "1 once bound to the advisory durable.", labels=[]
    )
    bound.add_metric([], 1 if stats.bound else 0)
    return [
        _counter(
            "ferry_dlq_router_advisories",
            "MAX_DELIVERIES / MSG_TERMINATED advisories handled, by outcome (error: retried "
            "later; invalid: unusable, terminated; failed: unexpected, retried then terminated).",
            ["outcome"],
            {(k,): v for k, v in outcomes.items()},
        ),
        bound,
    ]


def sweep_families(stats: Any) -> list[Metric]:
    """The router's sweep for unreported exhaustions, as Prometheus families."""
    return [
        _counter(
            "ferry_dlq_router_sweep",
            "Sweep for exhaustions no advisory reported: sweeps run, rows dead-lettered "
            "(DELIVERY_EXHAUSTED_UNREPORTED), rows left because JetStream may still deliver "
            "them, rows another path had recorded, errors.",
            ["outcome"],
            {
                ("sweep",): stats.sweeps,
                ("recorded",): stats.recorded,
                ("still_pending",): stats.still_pending,
                ("already",): stats.already,
                ("error",): stats.errors,
            },
        )
    ]


class ReplayerMetrics:
    """dlq-replayer: replays, and the dead-letter store by durable and status."""

    def __init__(self, role: RoleMetrics) -> None:
        self.role = role
        self._states = Gauge(
            "ferry_dead_letters_current",
            "Dead letters in the store by durable and status (dead, held, replaying, ...).",
            ["durable", "status"],
            registry=role.registry,
        )
        self._oldest = Gauge(
            "ferry_dead_letters_oldest_age_seconds",
            "Age of the oldest dead letter waiting (dead, held or parked), per durable.",
            ["durable"],
            registry=role.registry,
        )

    def watch(self, replayer: Any) -> None:
        """Export ``replayer.stats`` and refresh the store gauges from its pools."""
        self.role.add_collector(lambda: replayer_families(replayer.stats))
        self.role.add_refresher("dead_letters", lambda: self._refresh(replayer))

    async def _refresh(self, replayer: Any) -> None:
        statuses = ("dead", "held", "replaying", "replayed", "parked", "discarded")
        durables = sorted(replayer.topology.durables)
        counts = {(d, s): 0 for d in durables for s in statuses}
        oldest: dict[str, datetime | None] = dict.fromkeys(durables)
        for pool in replayer.pools.values():
            async with pool.acquire() as conn:
                rows = await conn.fetch(_DEAD_LETTER_STATES, durables)
            for r in rows:
                counts[(r["durable"], r["status"])] = r["count"]
                if r["oldest"] is not None:
                    known = oldest[r["durable"]]
                    oldest[r["durable"]] = r["oldest"] if known is None else min(known, r["oldest"])
        for (durable, status), value in counts.items():
            self._states.labels(durable, status).set(value)
        for durable, moment in oldest.items():
            self._oldest.labels(durable).set(_age(moment))


_DEAD_LETTER_STATES = """
SELECT durable, status, count(*) AS count,
       min(dead_lettered_at) FILTER (WHERE status IN ('dead', 'held', 'parked')) AS oldest
FROM dead_letters WHERE durable = ANY($1::text[]) GROUP BY durable, status
"""


def replayer_families(stats: Any) -> list[Metric]:
    """The replayer's exact counts as Prometheus families."""
    return [
        _counter(
            "ferry_dlq_replays",
            "Automatic replays published, by durable.",
            ["durable"],
            {(k,): v for k, v in stats.replayed_by_durable.items()},
        ),
        _counter(
            "ferry_dlq_replayer_events",
            "Replayer work by kind: replays settled as replayed, replays republished after "
            "an unconfirmed publish, entries skipped (taken by another replica), entries "
            "parked (nothing to replay), errors (retried), failures (unexpected), scans.",
            ["kind"],
            {
                ("settled",): stats.settled,
                ("republished",): stats.republished,
                ("skipped",): stats.skipped,
                ("parked",): stats.parked,
                ("error",): stats.errors,
                ("failed",): stats.failed,
                ("scan",): stats.scans,
            },
        ),
    ]


# --------------------------------------------------------------------------- HTTP server


def observe_app(app: web.Application, *, role: str) -> RoleMetrics:
    """Trace and time every request of an aiohttp ``app`` and serve its ``/metrics``.

    Each request gets a SERVER span continuing the caller's traceparent (the consumer's
    handler call), log lines carrying its message id, and a duration sample.
    """
    metrics = RoleMetrics(role)
    http = HttpServerMetrics(metrics)

    @web.middleware
    async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/metrics":
            return await handler(request)  # type: ignore[no-any-return]
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else request.path
        )
        message_id = request.headers.get("Idempotency-Key")
        clock = asyncio.get_running_loop()
        started, status = clock.time(), 500
        with (
            telemetry.server_span(request.method, route, request.headers, message_id) as span,
            telemetry.log_fields(message_id=message_id),
        ):
            try:
                response: web.StreamResponse = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                http.observe(request.method, route, status, clock.time() - started)
                if span is not None:
                    span.set_attribute("http.response.status_code", status)

    async def serve_metrics(_: web.Request) -> web.Response:
        body, content_type = await metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.middlewares.append(observe)
    app.router.add_get("/metrics", serve_metrics)
    return metrics


class HttpServerMetrics:
    """A handler service: request duration by method and status (HTTP semantic conventions)."""

    def __init__(self, role: RoleMetrics) -> None:
        self._duration = Histogram(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests.",
            ["http_request_method", "http_route", "http_response_status_code"],
            buckets=OPERATION_BUCKETS,
            registry=role.registry,
        )

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request served."""
        self._duration.labels(method, route, str(status)).observe(seconds)
