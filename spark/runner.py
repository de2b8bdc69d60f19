"""One run of the KPI job for one topology: check, read, compute, judge, write, report.

check      every database answers and has its tables; take the run lock
range      the new complete windows (watermark) or the explicit --since/--until range
read       Spark JDBC, partitioned: outboxes of the producing contexts, inboxes, dead
           letters and parked messages of the durables' target contexts
compute    expected deliveries joined across databases → KPI counts and percentiles
judge      PRD-022 targets per window and run total; INFRA-005 alerts per window
write      the windows' rows, the run, the watermark: one transaction (idempotent)
report     JSON, HTML with PNG plots, and the text summary
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from shared.contracts.loading import load_topology
from spark import kpis, sources, store
from spark.errors import (
    EXIT_OK,
    DatabaseUnreachable,
    JdbcDriverMissing,
    JobError,
    SchemaMissing,
    SparkFailed,
)
from spark.jdbc import jdbc_target
from spark.plan import Plan
from spark.report import Report, histogram_entries, run_directory, text_summary, write_report
from spark.settings import KpiSettings
from spark.transforms import (
    ROUTE_SCHEMA,
    all_kpis,
    event_facts,
    latency_histogram,
    lost_list,
    reason_counts,
)
from spark.verdicts import (
    AlertRules,
    Finding,
    Targets,
    apply_alerts,
    apply_slos,
    exit_code,
    verdict_word,
)
from spark.windows import RangeRequest, RunRange, decide_range, parse_instant

T = TypeVar("T")
#: Up to this many dead letters (parked messages) are broadcast to the join (tens of MB
#: at most).
BROADCAST_DEAD_LETTERS = BROADCAST_PARKED = 200_000


@dataclass(frozen=True)
class RunRequest:
    """What to run: a topology, optionally at a given instant or over an explicit range."""

    topology: Path
    as_of: datetime | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: Compute and report, but write nothing to the KPI tables (watermark untouched).
    dry_run: bool = False


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended."""

    exit_code: int
    report: Report
    report_dir: Path | None
    summary: str


@dataclass
class Computed:
    """What Spark computed for one range (collected to the driver: small by construction)."""

    events: int
    windows: list[dict[str, Any]]
    totals: list[dict[str, Any]]
    reasons: list[dict[str, Any]]
    histogram: list[dict[str, Any]]
    lost: list[dict[str, Any]]


def collect(frame: DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts, timestamps as aware UTC datetimes (PySpark alone gives naive local ones)."""
    ts = [f.name for f in frame.schema.fields if isinstance(f.dataType, TimestampType)]
    micros = frame.select(
        *(F.unix_micros(F.col(c)).alias(c) if c in ts else F.col(c) for c in frame.columns)
    )
    out = []
    for row in micros.collect():
        doc = row.asDict()
        for c in ts:
            if doc[c] is not None:
                doc[c] = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=doc[c])
        out.append(doc)
    return out


def preflight(settings: KpiSettings, topology: Path) -> None:
    """Check, before Spark starts, that every database answers and has its tables."""
    plan = Plan(load_topology(topology))
    kpi_database = plan.kpi_database(settings.kpi_database)

    async def check() -> None:
        for database in dict.fromkeys([*plan.databases(), kpi_database]):
            dsn = settings.dsn(database)
            jdbc_target(dsn, what=f"DSN of database {database!r}")
            conn = await store.connect(dsn, database, timeout=settings.kpi_connect_timeout)
            try:
                if database in plan.databases():
                    await store.require_tables(conn, database, store.SOURCE_TABLES)
                    await store.require_columns(conn, database, store.SOURCE_COLUMNS)
                if database == kpi_database:
                    await store.require_tables(conn, database, store.KPI_TABLES)
                    await store.require_columns(conn, database, store.KPI_COLUMNS)
            finally:
                await conn.close()

    asyncio.run(check())


def run_topology(spark: SparkSession, settings: KpiSettings, request: RunRequest) -> RunOutcome:
    """One complete run; raises :class:`JobError` (with its exit code) when it cannot judge."""
    with asyncio.Runner() as aio:
        return _Run(spark, settings, request, aio).execute()


class _Run:
    def __init__(
        self, spark: SparkSession, settings: KpiSettings, request: RunRequest, aio: asyncio.Runner
    ) -> None:
        self.spark, self.settings, self.request, self.aio = spark, settings, request, aio
        self.plan = Plan(load_topology(request.topology))
        self.window = settings.window_seconds
        self.as_of = (request.as_of or datetime.now(UTC)).astimezone(UTC)
        self.kpi_database = self.plan.kpi_database(settings.kpi_database)
        self.run_id = str(uuid.uuid4())
        self.started = datetime.now(UTC)
        self.conns: dict[str, asyncpg.Connection] = {}
        #: Seconds spent per phase (in the JSON report: where a run's time goes).
        self.timings: dict[str, float] = {}
        self.dead_letter_rows = self.parked_rows = 0
        self._lap = time.monotonic()

    def lap(self, phase: str) -> None:
        """Close the current phase's timing under ``phase``."""
        now = time.monotonic()
        self.timings[phase] = round(now - self._lap, 3)
        self._lap = now

    def sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.aio.run(coro)

    def execute(self) -> RunOutcome:
        clock = time.monotonic()
        try:
            self._connect()
            kpi_store = store.KpiStore(
                self.conns[self.kpi_database], topology=self.plan.name, window_seconds=self.window
            )
            self.sync(kpi_store.lock())
            rng = self._range(kpi_store)
            self.lap("check")
            if rng is None:
                return self._nothing_to_do(time.monotonic() - clock)
            computed = self._compute(rng)
            self.lap("spark")
            return self._judge_and_write(kpi_store, rng, computed, clock)
        finally:
            for conn in self.conns.values():
                self.sync(conn.close())

    # ---- check

    def _connect(self) -> None:
        timeout = self.settings.kpi_connect_timeout
        for database in [*self.plan.databases(), self.kpi_database]:
            if database not in self.conns:
                dsn = self.settings.dsn(database)
                jdbc_target(dsn, what=f"DSN of database {database!r}")  # refuse early
                self.conns[database] = self.sync(store.connect(dsn, database, timeout=timeout))
        for database in self.plan.databases():
            self.sync(store.require_tables(self.conns[database], database, store.SOURCE_TABLES))
            self.sync(store.require_columns(self.conns[database], database, store.SOURCE_COLUMNS))
        kpi_conn = self.conns[self.kpi_database]
        self.sync(store.require_tables(kpi_conn, self.kpi_database, store.KPI_TABLES))
        self.sync(store.require_columns(kpi_conn, self.kpi_database, store.KPI_COLUMNS))

    def _range(self, kpi_store: store.KpiStore) -> RunRange | None:
        watermark = self.sync(kpi_store.watermark())
        start = None
        if self.settings.kpi_start:
            start = parse_instant(self.settings.kpi_start, "FERRY_KPI_START")
        earliest = None
        if watermark is None and start is None and self.request.since is None:
            found = [
                self.sync(store.earliest_event(self.conns[s.database])) for s in self.plan.sources
            ]
            earliest = min((f for f in found if f is not None), default=None)
        return decide_range(
            RangeRequest(
                as_of=self.as_of,
                window_seconds=self.window,
                grace_seconds=self.settings.kpi_grace,
                watermark=watermark,
                since=self.request.since,
                until=self.request.until,
                start=start,
                earliest_event=earliest,
            )
        )

    # ---- read and compute

    def _read_outboxes(self, rng: RunRange) -> DataFrame:
        frames = []
        for source in self.plan.sources:
            conn = self.conns[source.database]
            span = self.sync(store.outbox_span(conn, rng.start, rng.end))
            if span.rows:
                frames.append(
                    sources.read_jdbc(
                        self.spark,
                        jdbc_target(self.settings.dsn(source.database)),
                        sources.outbox_query(source, rng.start, rng.end),
                        settings=self.settings,
                        column="seq",
                        span=span,
                    )
                )
        return sources.union_all(self.spark, frames, sources.OUTBOX_SCHEMA)

    def _read_inboxes(self, rng: RunRange) -> tuple[DataFrame, DataFrame]:
        inboxes, dead = [], []
        self.dead_letter_rows = 0
        for database, durables in self.plan.inbox_databases().items():
            target = jdbc_target(self.settings.dsn(database))
            conn = self.conns[database]
            low, high = sources.inbox_window(rng.start, rng.end)
            span = self.sync(store.inbox_span(conn, durables, low, high))
            if span.rows:
                query = sources.inbox_query(database, durables, rng.start, rng.end)
                inboxes.append(
                    sources.read_jdbc(self.spark, target, query, settings=self.settings,
                                      column="stream_seq", span=span)
                )  # fmt: skip
            count = self.sync(
                store.dead_letter_count(conn, durables, rng.start - sources.CLOCK_SLACK)
            )
            self.dead_letter_rows += count
            if count:
                query = sources.dead_letter_query(database, durables, rng.start)
                dead.append(sources.read_jdbc(self.spark, target, query, settings=self.settings))
        return (
            sources.union_all(self.spark, inboxes, sources.INBOX_SCHEMA),
            sources.union_all(self.spark, dead, sources.DEAD_LETTER_SCHEMA),
        )

    def _read_parked(self) -> DataFrame:
        """What the ``ordering: key`` durables hold parked now (no other durable parks)."""
        frames = []
        self.parked_rows = 0
        for database, durables in self.plan.parking_databases().items():
            count = self.sync(store.parked_count(self.conns[database], database, durables))
            self.parked_rows += count
            if count:
                target = jdbc_target(self.settings.dsn(database))
                query = sources.parked_query(database, durables)
                frames.append(sources.read_jdbc(self.spark, target, query, settings=self.settings))
        return sources.union_all(self.spark, frames, sources.PARKED_SCHEMA)

    def _compute(self, rng: RunRange) -> Computed:
        try:
            return self._compute_spark(rng)
        except (Py4JError, PySparkException) as exc:
            raise translate_spark_error(exc) from exc

    def _compute_spark(self, rng: RunRange) -> Computed:
        outbox = self._read_outboxes(rng).persist()
        try:
            per_kind = outbox.groupBy("context", "event_type", "event_version").count().collect()
            kinds = [(r["context"], r["event_type"], r["event_version"]) for r in per_kind]
            routes = self.spark.createDataFrame(
                [vars_tuple(r) for r in self.plan.routes(kinds)], ROUTE_SCHEMA
            )
            inbox, dead_letters = self._read_inboxes(rng)
            parked = self._read_parked()
            lost_before = self.as_of - timedelta(seconds=self.settings.kpi_grace)
            facts = event_facts(
                outbox, routes, inbox, dead_letters, parked,
                window_seconds=self.window, lost_before=lost_before,
                broadcast_dead_letters=self.dead_letter_rows <= BROADCAST_DEAD_LETTERS,
                broadcast_parked=self.parked_rows <= BROADCAST_PARKED,
            ).persist()  # fmt: skip
            try:
                return self._aggregate(facts, sum(int(r["count"]) for r in per_kind))
            finally:
                facts.unpersist()
        finally:
            outbox.unpersist()

    def _aggregate(self, facts: DataFrame, events: int) -> Computed:
        rows = collect(all_kpis(facts, exact=self.settings.kpi_exact_percentiles))
        return Computed(
            events=events,
            windows=[r for r in rows if r["window_start"] is not None],
            totals=[r for r in rows if r["window_start"] is None],
            reasons=collect(reason_counts(facts)),
            histogram=collect(latency_histogram(facts)),
            lost=collect(lost_list(facts, self.settings.kpi_max_listed_lost)),
        )

    # ---- judge, write, report

    def _judge_and_write(
        self, kpi_store: store.KpiStore, rng: RunRange, computed: Computed, clock: float
    ) -> RunOutcome:
        windows = kpis.complete_windows(
            computed.windows,
            topology=self.plan.name,
            windows=rng.windows(self.window),
            window_seconds=self.window,
            combos=self.plan.combos(kpis.combos_seen(computed.windows)),
        )
        totals = kpis.total_rows(computed.totals)
        targets, rules = (
            Targets.from_settings(self.settings),
            AlertRules.from_settings(self.settings),
        )
        by_window = apply_slos(windows, targets, scope="window")
        by_total = apply_slos(totals, targets, scope="total")
        lookback = timedelta(seconds=self.window * max(rules.baseline_windows, rules.lag_windows))
        history = self.sync(kpi_store.history(rng.start - lookback, rng.start))
        alerts = apply_alerts(windows, history, rules, window_seconds=self.window)
        gate, other = (
            (by_total, by_window) if self.settings.kpi_gate == "total" else (by_window, by_total)
        )
        code = exit_code(gate, alerts)
        report = self._report(rng, code, 0.0, gate, other, alerts)
        report.events, report.windows, report.totals = computed.events, windows, totals
        report.reasons = kpis.reason_rows(
            computed.reasons, windows, topology=self.plan.name, window_seconds=self.window
        )
        report.histogram = histogram_entries(computed.histogram)
        report.lost_count = sum(int(r["lost_candidates"]) for r in totals if r["subject"] == "*")
        report.lost_listed = computed.lost
        directory = run_directory(
            self.settings.kpi_report_dir, self.plan.name, self.as_of, self.run_id
        )
        if not self.request.dry_run:
            self.sync(kpi_store.write(self._write_set(rng, report, directory)))
        self.lap("judge_and_write")
        report.timings = self.timings
        report.duration_seconds = time.monotonic() - clock
        write_report(report, directory, keep=self.settings.kpi_keep_reports)
        self.lap("report")
        return RunOutcome(code, report, directory, text_summary(report, directory))

    def _write_set(self, rng: RunRange, report: Report, directory: Path) -> store.WriteSet:
        return store.WriteSet(
            run_id=uuid.UUID(self.run_id),
            start=rng.start,
            end=rng.end,
            as_of=self.as_of,
            started_at=self.started,
            incremental=rng.incremental,
            window_count=len(rng.windows(self.window)),
            events=report.events,
            verdict=report.verdict,
            exit_code=report.exit_code,
            report_dir=str(directory),
            windows=report.windows,
            reasons=report.reasons,
        )

    def _report(
        self,
        rng: RunRange | None,
        code: int,
        elapsed: float,
        gate: list[Finding],
        other: list[Finding],
        alerts: list[Finding],
    ) -> Report:
        return Report(
            run_id=self.run_id,
            topology=self.plan.name,
            as_of=self.as_of,
            start=None if rng is None else rng.start,
            end=None if rng is None else rng.end,
            incremental=rng is None or rng.incremental,
            window_seconds=self.window,
            grace_seconds=self.settings.kpi_grace,
            kpi_database=self.kpi_database,
            gate=self.settings.kpi_gate,
            targets=Targets.from_settings(self.settings),
            rules=AlertRules.from_settings(self.settings),
            exit_code=code,
            verdict=verdict_word(code),
            duration_seconds=elapsed,
            gate_findings=gate,
            other_findings=other,
            alerts=alerts,
            critical=self.plan.critical_durables(),
        )

    def _nothing_to_do(self, elapsed: float) -> RunOutcome:
        report = self._report(None, EXIT_OK, elapsed, [], [], [])
        report.note = "Nothing new: no complete window after the watermark (or no events yet)."
        return RunOutcome(EXIT_OK, report, None, text_summary(report, None))


def vars_tuple(route: Any) -> tuple[Any, ...]:
    """A slotted dataclass as a tuple in field order (for createDataFrame)."""
    return tuple(getattr(route, name) for name in route.__slots__)


def translate_spark_error(exc: BaseException) -> JobError:
    """A Spark/JDBC failure as the job's error kinds (by the Java exception's text)."""
    text = str(exc)
    first = text.strip().splitlines()[0][:400] if text.strip() else type(exc).__name__
    if "ClassNotFoundException" in text and "postgresql" in text.lower():
        return JdbcDriverMissing(
            "Spark cannot load org.postgresql.Driver: pass the jar (spark-submit --jars "
            f"/usr/share/java/postgresql.jar, or FERRY_KPI_JDBC_DRIVER): {first}"
        )
    if "PSQLException" in text and ("onnect" in text or "refused" in text):
        return DatabaseUnreachable(f"a database became unreachable during the run: {first}")
    if "PSQLException" in text and "does not exist" in text:
        return SchemaMissing(f"a table or column is missing (run `ferry migrate`): {first}")
    return SparkFailed(f"Spark failed: {first}")
