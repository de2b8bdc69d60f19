"""The whole job on real PostgreSQL: a generated dataset whose KPIs are known in advance.

The expectation comes from the dataset's specs (tests/spark/dataset.py), never from the
databases; the job reads the databases over JDBC (split into partitions) and must find
exactly those numbers, write them idempotently, and move its watermark correctly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from devstack.postgres import PostgresServer
from spark.errors import EXIT_ALERT, EXIT_OK, EXIT_SLO_BREACH
from spark.runner import RunOutcome, RunRequest, run_topology
from spark.transforms import COUNT_COLUMNS, MEASURE_COLUMNS
from tests.spark.conftest import KpiWorld, make_world
from tests.spark.dataset import (
    Ev,
    Fate,
    clean_events,
    expected,
    expected_totals,
    load,
    operator_events,
    standard_events,
)

pytestmark = pytest.mark.integration

HOUR = 3600


def base_hour() -> datetime:
    """A window start far enough back that four hourly windows lie in the past."""
    now = datetime.now(UTC)
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)


def stored(world: KpiWorld, topology: str = "sea-vibespro") -> list[dict[str, Any]]:
    return world.fetch(
        "sea",
        "SELECT * FROM kpi_windows WHERE topology = $1 ORDER BY window_start, context, durable,"
        " subject",
        topology,
    )


def _check(row: dict[str, Any], want: dict[str, Any]) -> None:
    where = (row["window_start"], row["context"], row["durable"], row["subject"])
    for column in COUNT_COLUMNS:
        assert row[column] == want[column], (where, column)
    for column in MEASURE_COLUMNS:
        if want[column] is None:
            assert row[column] is None, (where, column)
        else:
            assert row[column] == pytest.approx(want[column], abs=1e-9), (where, column)


@dataclass
class StandardRun:
    """The standard dataset, loaded once per module and judged once by the job."""

    world: KpiWorld
    base: datetime
    events: list[Ev]
    outcome: RunOutcome
    rows: list[dict[str, Any]]

    def row(self, hours: int, context: str, durable: str, subject: str) -> dict[str, Any]:
        start = self.base + timedelta(hours=hours)
        return next(
            r
            for r in self.rows
            if (r["window_start"], r["context"], r["durable"], r["subject"])
            == (start, context, durable, subject)
        )


@pytest.fixture(scope="module")
def standard(
    spark: SparkSession, pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> StandardRun:
    world = make_world(tmp_path_factory.mktemp("standard"), pg_server, only_model_published=True)
    base = base_hour()
    events = standard_events()
    load(world, events, base, HOUR)
    # Three rows per partition: every read is split, so partition edges are exercised.
    settings = world.settings(kpi_partition_min_rows=3)
    as_of = base + timedelta(hours=4, minutes=10)
    outcome = run_topology(spark, settings, RunRequest(world.path, as_of=as_of))
    return StandardRun(world, base, events, outcome, stored(world))


def test_kpis_match_the_generated_dataset(standard: StandardRun) -> None:
    want = expected(standard.events, standard.base, HOUR)
    assert len(want) == 12  # keys with their roll-ups: 3 in window 0, 2 in window 2, 1 in window 3
    for (start, context, durable, subject), expectation in want.items():
        hours = int((start - standard.base).total_seconds()) // HOUR
        _check(standard.row(hours, context, durable, subject), expectation)


def test_rates_follow_the_counts(standard: StandardRun) -> None:
    sea = standard.row(0, "sea", "vibespro__from_sea", "sea.event.model_published.v1")
    assert sea["delivery_rate"] == 1.0
    assert sea["duplicate_rate"] == pytest.approx((2 + 1) / 16)  # 2 skipped + one 409
    assert sea["dlq_rate"] == pytest.approx(2 / 20)
    assert sea["retry_rate"] == pytest.approx((1 + 1 + 3 + 1) / 20)
    assert sea["success_ratio"] == pytest.approx(16 / 18)
    vibe = standard.row(0, "vibespro", "sea__from_vibespro", "vibespro.event.vibe_created.v1")
    assert vibe["delivery_rate"] == pytest.approx(5 / 6)
    unsubscribed = standard.row(0, "sea", "-", "sea.event.model_archived.v1")
    assert (unsubscribed["produced"], unsubscribed["published"]) == (2, 1)
    assert unsubscribed["lost_candidates"] == 0  # nobody should receive it


def test_every_window_has_every_key_even_when_empty(standard: StandardRun) -> None:
    starts = sorted({r["window_start"] for r in standard.rows})
    assert starts == [standard.base + timedelta(hours=h) for h in range(4)]
    keys = [
        {
            (r["context"], r["durable"], r["subject"])
            for r in standard.rows
            if r["window_start"] == s
        }
        for s in starts
    ]
    assert all(k == keys[0] for k in keys)
    empty = [r for r in standard.rows if r["window_start"] == starts[1]]
    assert empty and all(r["produced"] == 0 and r["delivery_rate"] is None for r in empty)
    assert all(r["latency_p99_ms"] is None and r["slo_breaches"] == [] for r in empty)


def test_breaches_are_named_and_gate_the_exit_code(standard: StandardRun) -> None:
    assert standard.outcome.exit_code == EXIT_SLO_BREACH
    sea_w0 = standard.row(0, "sea", "vibespro__from_sea", "sea.event.model_published.v1")
    assert set(sea_w0["slo_breaches"]) == {"lost", "duplicates", "dlq"}
    assert standard.row(2, "sea", "vibespro__from_sea", "*")["slo_breaches"] == ["latency"]
    assert standard.row(3, "sea", "vibespro__from_sea", "*")["slo_breaches"] == []
    gate = {(f.name, f.durable, f.subject) for f in standard.outcome.report.gate_findings}
    assert ("delivery", "sea__from_vibespro", "vibespro.event.vibe_created.v1") in gate
    assert ("lost", "vibespro__from_sea", "*") in gate
    assert all(f.scope == "total" for f in standard.outcome.report.gate_findings)


def test_report_lists_lost_candidates_and_totals(standard: StandardRun) -> None:
    directory = standard.outcome.report_dir
    assert directory is not None
    doc = json.loads((directory / "report.json").read_text())
    # The unreceived event only: the stuck one has an inbox row, retrying (issue 42).
    lost_ids = {str(e.id) for e in standard.events
                if e.fate.kind == "unreceived" and e.durable != "-"}  # fmt: skip
    assert {item["message_id"] for item in doc["lost_candidates"]["listed"]} == lost_ids
    assert doc["lost_candidates"]["count"] == len(lost_ids) == 1
    assert doc["not_final"] == {"parked": 0, "retrying": 1, "in_flight": 0}
    totals = {(t["context"], t["durable"], t["subject"]): t for t in doc["totals"]}
    for key, expectation in expected_totals(standard.events).items():
        for column in COUNT_COLUMNS:
            assert totals[key][column] == expectation[column], (key, column)
        p99 = expectation["latency_p99_ms"]
        assert totals[key]["latency_p99_ms"] == (None if p99 is None else pytest.approx(p99))


def test_reasons_by_code(standard: StandardRun) -> None:
    rows = standard.world.fetch(
        "sea",
        "SELECT kind, reason_code, count, rate FROM kpi_reasons WHERE window_start = $1"
        " AND durable = 'vibespro__from_sea' AND subject = '*' ORDER BY kind, reason_code",
        standard.base,
    )
    assert [(r["kind"], r["reason_code"], r["count"]) for r in rows] == [
        ("dead_letter", "HANDLER_REJECTED", 1),
        ("dead_letter", "MAX_DELIVERIES_EXCEEDED", 1),
        ("retry", "HTTP_500", 3),
        ("retry", "HTTP_503", 3),
    ]
    assert rows[2]["rate"] == pytest.approx(3 / 20)


def test_reports_are_written(standard: StandardRun) -> None:
    directory = standard.outcome.report_dir
    assert directory is not None
    for name in ("latency.png", "windows.png"):
        assert (directory / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (directory / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "BREACH" in page
    assert (directory.parent / "latest").resolve() == directory.resolve()
    assert "BREACH" in (directory / "summary.txt").read_text()


def test_parked_and_waited_events_of_a_keyed_durable(
    spark: SparkSession, pg_server: PostgresServer, tmp_path: Path
) -> None:
    # Issue 42: the demo's cg_h_publish reported its parked events as lost. Here the job
    # reads parked_messages over JDBC: the events behind the held head are parked, the head
    # is dead-lettered, only the truly missing event is lost, and the latency of the events
    # that waited for an operator stays out of the pipeline's own (and of its verdict).
    world = make_world(tmp_path, pg_server, only_model_published=True, keyed=True)
    base = base_hour()
    events = operator_events()
    load(world, events, base, HOUR)
    as_of = base + timedelta(hours=1, minutes=10)
    outcome = run_topology(spark, world.settings(), RunRequest(world.path, as_of=as_of))
    rows = stored(world)
    want = expected(events, base, HOUR)
    for row in rows:
        key = (row["window_start"], row["context"], row["durable"], row["subject"])
        if key in want:
            _check(row, want[key])
    lane = next(r for r in rows if r["durable"] == "vibespro__from_sea" and r["subject"] == "*")
    counts = ("lost_candidates", "parked", "retrying", "in_flight", "dead_lettered", "waited")
    assert tuple(lane[c] for c in counts) == (1, 5, 1, 1, 2, 3)
    assert lane["latency_max_ms"] < 100 and lane["waited_latency_max_ms"] == 150_000.0
    assert outcome.exit_code == EXIT_SLO_BREACH
    gate = {(f.name, f.durable) for f in outcome.report.gate_findings}
    assert ("lost", "vibespro__from_sea") in gate
    assert not any(name == "latency" for name, _ in gate)  # the waited latency is not judged
    assert outcome.report_dir is not None
    doc = json.loads((outcome.report_dir / "report.json").read_text())
    missing = [str(e.id) for e in events if e.fate.kind == "unreceived"]
    assert [item["message_id"] for item in doc["lost_candidates"]["listed"]] == missing
    assert doc["not_final"] == {"parked": 5, "retrying": 1, "in_flight": 1}
    [waited] = doc["waited_for_operator"]
    assert (waited["durable"], waited["waited"], waited["waited_latency_max_ms"]) == (
        "vibespro__from_sea",
        3,
        150_000.0,
    )
    summary = outcome.summary
    assert "lost candidates: 1 " in summary
    assert "not final yet (not lost): 5 parked · 1 retrying · 1 in flight" in summary
    assert "sea/vibespro__from_sea: 3 events, p99 148800.0 ms, max 150000.0 ms" in summary
    header = next(line for line in summary.splitlines() if line.startswith("context "))
    assert header.split()[-3:] == ["lost", "parked", "verdict"]
    page = (outcome.report_dir / "report.html").read_text()
    assert "<th>parked</th>" in page and "Waited for an operator" in page


def test_rerunning_a_window_changes_nothing(spark: SparkSession, world: KpiWorld) -> None:
    base = base_hour()
    load(world, standard_events(), base, HOUR)
    as_of = base + timedelta(hours=4, minutes=10)
    first = run_topology(spark, world.settings(), RunRequest(world.path, as_of=as_of))
    rows_before = stored(world)
    reasons_before = world.fetch("sea", "SELECT * FROM kpi_reasons ORDER BY 1,2,3,4,5,6,7,8")
    # Re-run the same windows explicitly, with a different partitioning.
    again = run_topology(
        spark,
        world.settings(kpi_partition_min_rows=2),
        RunRequest(world.path, as_of=as_of, since=base, until=base + timedelta(hours=4)),
    )
    assert again.exit_code == first.exit_code
    assert stored(world) == rows_before
    assert (
        world.fetch("sea", "SELECT * FROM kpi_reasons ORDER BY 1,2,3,4,5,6,7,8") == reasons_before
    )
    runs = world.fetch("sea", "SELECT incremental FROM kpi_runs ORDER BY started_at")
    assert [r["incremental"] for r in runs] == [True, False]


def test_watermark_processes_only_new_windows(spark: SparkSession, world: KpiWorld) -> None:
    base = base_hour()
    load(world, standard_events(), base, HOUR)
    settings = world.settings()
    run_topology(
        spark, settings, RunRequest(world.path, as_of=base + timedelta(hours=2, minutes=6))
    )
    assert sorted({r["window_start"] for r in stored(world)}) == [base, base + timedelta(hours=1)]
    mark = world.fetch("sea", "SELECT watermark FROM kpi_watermarks")
    assert mark == [{"watermark": base + timedelta(hours=2)}]
    # Tamper with a finished window: a run that recomputed it would overwrite the marker.
    world.execute("sea", "UPDATE kpi_windows SET produced = -1 WHERE window_start = $1", base)

    second = run_topology(
        spark, settings, RunRequest(world.path, as_of=base + timedelta(hours=4, minutes=6))
    )
    assert second.report.start == base + timedelta(hours=2)
    assert second.report.end == base + timedelta(hours=4)
    rows = stored(world)
    assert {r["produced"] for r in rows if r["window_start"] == base} == {-1}
    assert sorted({r["window_start"] for r in rows}) == [
        base + timedelta(hours=h) for h in range(4)
    ]
    assert world.fetch("sea", "SELECT watermark FROM kpi_watermarks")[0][
        "watermark"
    ] == base + timedelta(hours=4)

    third = run_topology(
        spark, settings, RunRequest(world.path, as_of=base + timedelta(hours=4, minutes=30))
    )
    assert third.exit_code == EXIT_OK and third.report_dir is None
    assert "Nothing new" in third.summary
    assert len(world.fetch("sea", "SELECT run_id FROM kpi_runs")) == 2


def test_clean_traffic_passes(spark: SparkSession, world: KpiWorld) -> None:
    base = base_hour()
    load(world, clean_events(window=0) + clean_events(window=2), base, HOUR)
    # Results may go to any database of the topology: here vibespro's, not the default sea.
    settings = world.settings(kpi_database=world.database("vibespro"))
    as_of = base + timedelta(hours=3, minutes=6)
    outcome = run_topology(spark, settings, RunRequest(world.path, as_of=as_of))
    assert outcome.exit_code == EXIT_OK, outcome.summary
    assert "PASS" in outcome.summary
    assert stored(world) == []
    rows = world.fetch("vibespro", "SELECT * FROM kpi_windows")
    assert all(r["slo_breaches"] == [] and r["alerts"] == [] for r in rows)
    assert sum(r["processed"] for r in rows if r["subject"] == "*") == 20


def test_alert_without_breach_exits_4(spark: SparkSession, world: KpiWorld) -> None:
    base = base_hour()
    events = clean_events(window=0, count=10)
    events.append(
        Ev(0, 100, "sea", "model_published", 1, Fate("dead", dead_reason="HANDLER_REJECTED"))
    )
    load(world, events, base, HOUR)
    # An operator who tolerates 50 % dead letters still gets INFRA-005's success-ratio alert.
    settings = world.settings(kpi_dlq_max=0.5)
    outcome = run_topology(
        spark, settings, RunRequest(world.path, as_of=base + timedelta(hours=1, minutes=6))
    )
    assert outcome.exit_code == EXIT_ALERT, outcome.summary
    assert [(a.name, a.durable) for a in outcome.report.alerts] == [
        ("success_ratio", "vibespro__from_sea")
    ]
    row = next(
        r for r in stored(world) if r["durable"] == "vibespro__from_sea" and r["subject"] == "*"
    )
    assert row["alerts"] == ["success_ratio"] and row["slo_breaches"] == []


def test_dry_run_writes_reports_only(spark: SparkSession, world: KpiWorld) -> None:
    base = base_hour()
    load(world, clean_events(), base, HOUR)
    as_of = base + timedelta(hours=1, minutes=6)
    outcome = run_topology(
        spark, world.settings(), RunRequest(world.path, as_of=as_of, dry_run=True)
    )
    assert outcome.report_dir is not None and (outcome.report_dir / "report.json").exists()
    assert stored(world) == [] and world.fetch("sea", "SELECT * FROM kpi_watermarks") == []


def test_a_second_run_at_the_same_time_is_refused(spark: SparkSession, world: KpiWorld) -> None:
    import asyncio

    import asyncpg

    from spark.errors import EXIT_LOCKED, RunLocked
    from spark.store import LOCK_CLASS

    async def hold_lock_and_run() -> None:
        conn = await asyncpg.connect(world.dsn("sea"))
        try:
            await conn.execute("SELECT pg_advisory_lock($1, hashtext($2))", LOCK_CLASS,
                               "sea-vibespro:3600")  # fmt: skip
            loop = asyncio.get_running_loop()
            request = RunRequest(world.path)
            with pytest.raises(RunLocked, match="in progress") as caught:
                await loop.run_in_executor(None, run_topology, spark, world.settings(), request)
            assert caught.value.exit_code == EXIT_LOCKED
        finally:
            await conn.close()

    asyncio.run(hold_lock_and_run())


def test_the_job_needs_no_more_than_its_own_login(spark: SparkSession, world: KpiWorld) -> None:
    # The login shared.access.db_roles grants kpi-spark-job-<topology>: SELECT on the sources
    # (row-level security on its durables' inbox and dead-letter rows), DML on kpi_* only.
    # Its DSNs carry ?passfile=, which JDBC does not know: the job reads it like libpq.
    base = base_hour()
    load(world, clean_events(window=0), base, HOUR)
    databases = world.role_databases("kpi-spark-job-sea-vibespro")
    assert all("passfile=" in dsn and "ferry_kpi_spark_job" in dsn for dsn in databases.values())
    settings = world.settings(databases=databases)
    as_of = base + timedelta(hours=1, minutes=6)
    outcome = run_topology(spark, settings, RunRequest(world.path, as_of=as_of))
    assert outcome.exit_code == EXIT_OK, outcome.summary
    assert sum(r["processed"] for r in stored(world) if r["subject"] == "*") == 10
