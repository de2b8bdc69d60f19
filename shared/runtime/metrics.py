"""The metrics core of every role, served on ``/metrics`` beside /healthz and /readyz.

Names follow the OpenTelemetry messaging semantic conventions where they define one
(``messaging.client.sent.messages`` → ``messaging_client_sent_messages_total``, attribute
names with dots → underscores, as OpenTelemetry's own Prometheus exporter writes them);
the rest are ``ferry_*``. Each role process has one registry (:class:`RoleMetrics`) with
the process collectors (CPU, memory, GC); each role owns its instruments (the
``metrics.py`` of its ``services/<role>/`` package) and adds them there. Counters that a
role's stats already count exactly are read from the stats at scrape time (no work on the
hot path); gauges that need a query (backlogs, lag, dead-letter states) are refreshed at
scrape time, at most every ``FERRY_METRICS_REFRESH_INTERVAL`` seconds. The table of every
series is in docs/reference/metrics.md (the docs build fails on one it does not name).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.runtime.readiness import ReadinessCheck, run_checks
from shared.waits import within

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
                    await within(REFRESH_TIMEOUT, refresher())
                except Exception as exc:  # a gauge source down must not fail the scrape
                    self._refresh_errors.labels(source).inc()
                    log.warning("metrics refresh of %s failed: %s", source, exc)
            self._last_refresh = time.monotonic()

    async def render(self) -> tuple[bytes, str]:
        """The exposition text (refreshed first) and its content type."""
        await self.refresh()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def age_seconds(oldest: str | datetime | None) -> float:
    """Seconds since ``oldest`` (an ISO string or a datetime; 0 when None or in the future)."""
    if oldest is None:
        return 0.0
    moment = datetime.fromisoformat(oldest) if isinstance(oldest, str) else oldest
    return max((datetime.now(UTC) - moment).total_seconds(), 0.0)


def counter_family(
    name: str, doc: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> Metric:
    """A counter family computed at scrape time: one sample per label tuple."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family


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
