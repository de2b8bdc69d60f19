"""The KPI job's pure parts: DSN conversion, routes, windows and ranges, rates, verdicts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.contracts.loading import load_topology
from shared.domain.errors import ConfigurationError
from spark.errors import (
    EXIT_ALERT,
    EXIT_OK,
    EXIT_SLO_BREACH,
    DatabaseUnreachable,
    JdbcDriverMissing,
    SchemaMissing,
    SparkFailed,
)
from spark.jdbc import jdbc_target
from spark.kpis import complete_windows, empty_counts, with_rates
from spark.plan import ALL_SUBJECTS, NO_DURABLE, Combo, Plan
from spark.runner import translate_spark_error
from spark.verdicts import (
    AlertRules,
    HistoryPoint,
    Targets,
    apply_alerts,
    apply_slos,
    exit_code,
    slo_checks,
)
from spark.windows import RangeRequest, ceil_window, decide_range, floor_window, next_run
from tests.conftest import ROOT

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOUR = 3600


# ---- DSN → JDBC


def test_dsn_becomes_jdbc_url_with_credentials_apart() -> None:
    target = jdbc_target("postgresql://ferry:s%40cret@db.example:5433/sea?sslmode=require")
    assert target.url == "jdbc:postgresql://db.example:5433/sea?sslmode=require"
    assert target.properties["user"] == "ferry"
    assert target.properties["password"] == "s@cret"
    assert "cret" not in repr(target)
    assert target.options()["driver"] == "org.postgresql.Driver"


def test_dsn_defaults_and_ipv6() -> None:
    assert jdbc_target("postgres://[::1]/db").url == "jdbc:postgresql://[::1]:5432/db"
    props = jdbc_target("postgresql://u@h/db?connect_timeout=5&application_name=x").properties
    assert props["ApplicationName"] == "x" and "password" not in props
    assert jdbc_target("postgresql://u@h/db?connect_timeout=5").url.endswith("?connectTimeout=5")


def test_passfile_gives_the_password_like_libpq(tmp_path: Path) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text(
        "# comment\n"
        "other.host:5432:sea:ferry:wrong\n"
        "db.example:*:sea:ferry:pa\\:ss\n"
        "*:*:*:ferry:fallback\n"
    )
    dsn = f"postgresql://ferry@db.example:5433/sea?passfile={passfile}&sslmode=verify-full"
    target = jdbc_target(dsn)
    assert target.properties["password"] == "pa:ss"
    assert target.url == "jdbc:postgresql://db.example:5433/sea?sslmode=verify-full"
    other = jdbc_target(f"postgresql://ferry@db.example/vib?passfile={passfile}")
    assert other.properties["password"] == "fallback"
    with pytest.raises(ConfigurationError, match=r"passfile .*missing cannot be read"):
        jdbc_target(f"postgresql://ferry@h/db?passfile={tmp_path / 'missing'}")


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("mysql://h/db", "scheme"),
        ("postgresql:///db?host=/run/postgresql", "TCP host"),
        ("postgresql://h:5432/", "no database"),
        ("postgresql://h/db?gssencmode=disable", "gssencmode"),
    ],
)
def test_bad_dsns_are_refused_by_name(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        jdbc_target(dsn, what="DSN of database 'x'")


# ---- routes


def _topology(tmp_path: Path, *, narrow: bool) -> Plan:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/sea-vibespro.yaml").read_text())
    if narrow:
        doc["durables"]["vibespro__from_sea"]["filter_subjects"] = ["sea.event.model_published.>"]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return Plan(load_topology(path))


def test_routes_follow_the_durables_filters(tmp_path: Path) -> None:
    plan = _topology(tmp_path, narrow=True)
    routes = plan.routes(
        [
            ("sea", "model_published", 1),
            ("sea", "model_archived", 3),
            ("vibespro", "vibe_created", 2),
        ]
    )
    got = {(r.subject, r.durable, r.target_database) for r in routes}
    assert got == {
        ("sea.event.model_published.v1", "vibespro__from_sea", "vibespro"),
        ("sea.event.model_archived.v3", NO_DURABLE, None),
        ("vibespro.event.vibe_created.v2", "sea__from_vibespro", "sea"),
    }
    assert plan.databases() == ["sea", "vibespro"]
    assert plan.inbox_databases() == {
        "sea": ["sea__from_vibespro"],
        "vibespro": ["vibespro__from_sea"],
    }


def test_routes_on_partitioned_streams_follow_what_each_consumer_delivers(
    tmp_path: Path,
) -> None:
    # Subjects of a partitioned stream end in a partition token: an unordered durable's
    # filter names it with '*', an ordered durable's consumers narrow theirs per partition.
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/sea-vibespro.yaml").read_text())
    doc["contexts"]["sea"]["stream"]["partitions"] = 4
    doc["contexts"]["vibespro"]["stream"]["partitions"] = 2
    doc["durables"]["vibespro__from_sea"]["filter_subjects"] = [
        "sea.event.model_published.v1.*",
        "sea.event.model_archived.>",
    ]
    ordered = doc["durables"]["sea__from_vibespro"]
    ordered.update(ordering="key", filter_subjects=["vibespro.event.vibe_created.v2"])
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = Plan(load_topology(path))
    routes = plan.routes(
        [
            ("sea", "model_published", 1),
            ("sea", "model_published", 2),
            ("sea", "model_archived", 3),
            ("vibespro", "vibe_created", 1),
            ("vibespro", "vibe_created", 2),
        ]
    )
    assert {(r.subject, r.durable) for r in routes} == {
        ("sea.event.model_published.v1", "vibespro__from_sea"),
        ("sea.event.model_published.v2", NO_DURABLE),
        ("sea.event.model_archived.v3", "vibespro__from_sea"),
        ("vibespro.event.vibe_created.v1", NO_DURABLE),
        ("vibespro.event.vibe_created.v2", "sea__from_vibespro"),
    }


def test_combos_cover_manifests_and_roll_ups(tmp_path: Path) -> None:
    plan = _topology(tmp_path, narrow=False)
    combos = plan.combos([Combo("sea", "vibespro__from_sea", "sea.event.other.v1", "vibespro")])
    keys = {(c.context, c.durable, c.subject) for c in combos}
    assert ("sea", "vibespro__from_sea", ALL_SUBJECTS) in keys
    assert ("vibespro", "sea__from_vibespro", "vibespro.event.vibe_created.v2") in keys
    assert ("sea", "vibespro__from_sea", "sea.event.other.v1") in keys


def test_the_kpi_database_must_be_one_of_the_topology(tmp_path: Path) -> None:
    plan = _topology(tmp_path, narrow=False)
    assert plan.kpi_database(None) == "sea"
    assert plan.kpi_database("vibespro") == "vibespro"
    with pytest.raises(ConfigurationError, match="'reports' is not a database of topology"):
        plan.kpi_database("reports")


def test_two_producers_in_one_database_are_refused(tmp_path: Path) -> None:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/sea-vibespro.yaml").read_text())
    doc["contexts"]["vibespro"]["database"] = "sea"
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigurationError, match="cannot tell their outbox rows apart"):
        Plan(load_topology(path))


# ---- windows and ranges


def test_window_edges() -> None:
    assert floor_window(T0, HOUR) == T0
    assert floor_window(T0 - timedelta(microseconds=1), HOUR) == T0 - timedelta(hours=1)
    assert ceil_window(T0, HOUR) == T0
    assert ceil_window(T0 + timedelta(microseconds=1), HOUR) == T0 + timedelta(hours=1)
    assert floor_window(T0 + timedelta(seconds=17), 10) == T0 + timedelta(seconds=10)


def _req(**kw: Any) -> RangeRequest:
    values: dict[str, Any] = {"as_of": T0 + timedelta(minutes=20), "window_seconds": HOUR,
                              "grace_seconds": 300.0}  # fmt: skip
    values.update(kw)
    return RangeRequest(**values)


def test_first_run_starts_at_the_earliest_event_and_stops_at_the_last_complete_window() -> None:
    rng = decide_range(_req(earliest_event=T0 - timedelta(hours=5, minutes=30)))
    assert rng is not None and rng.incremental
    assert (rng.start, rng.end) == (T0 - timedelta(hours=6), T0)
    assert len(rng.windows(HOUR)) == 6


def test_the_grace_period_holds_back_a_window_that_just_ended() -> None:
    rng = decide_range(
        _req(as_of=T0 + timedelta(minutes=4), earliest_event=T0 - timedelta(hours=2))
    )
    assert rng is not None and rng.end == T0 - timedelta(hours=1)


def test_watermark_runs_resume_and_stop_when_up_to_date() -> None:
    rng = decide_range(
        _req(watermark=T0 - timedelta(hours=2), earliest_event=T0 - timedelta(days=9))
    )
    assert rng is not None and (rng.start, rng.end) == (T0 - timedelta(hours=2), T0)
    assert decide_range(_req(watermark=T0)) is None
    assert decide_range(_req()) is None  # no events, no watermark


def test_explicit_range_includes_the_open_window_and_keeps_the_watermark() -> None:
    rng = decide_range(
        _req(watermark=T0, since=T0 - timedelta(minutes=90), until=T0 + timedelta(minutes=20))
    )
    assert rng is not None and not rng.incremental
    assert (rng.start, rng.end) == (T0 - timedelta(hours=2), T0 + timedelta(hours=1))


def test_schedule_slots() -> None:
    assert next_run(T0 + timedelta(minutes=1), HOUR, 301) == T0 + timedelta(seconds=301)
    assert next_run(T0 + timedelta(minutes=6), HOUR, 301) == T0 + timedelta(hours=1, seconds=301)
    assert next_run(T0 + timedelta(seconds=301), HOUR, 301) == T0 + timedelta(hours=1, seconds=301)


# ---- rates and verdicts


def _row(**counts: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"context": "sea", "durable": "d", "subject": "*", "window_start": T0}
    row.update(empty_counts())
    row.update(counts)
    return with_rates(row)


def test_rates_are_none_without_a_denominator() -> None:
    row = _row()
    assert all(
        row[k] is None for k in ("delivery_rate", "duplicate_rate", "dlq_rate", "success_ratio")
    )
    row = _row(produced=4, published=4, processed=2, dead_lettered=2, duplicate_deliveries=1)
    assert (row["delivery_rate"], row["duplicate_rate"], row["dlq_rate"], row["success_ratio"]) == (
        1.0, 0.5, 0.5, 0.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("counts", "breaches"),
    [
        ({"produced": 10000, "published": 9999, "processed": 9999}, []),  # exactly 99.99 %
        ({"produced": 10000, "published": 9998, "processed": 9998}, ["delivery"]),
        ({"produced": 1000, "published": 1000, "processed": 999, "dead_lettered": 1}, ["dlq"]),
        ({"produced": 1001, "published": 1001, "processed": 1000, "dead_lettered": 1}, []),
        ({"produced": 5, "published": 5, "processed": 5, "handler_409": 1}, ["duplicates"]),
        ({"produced": 5, "published": 5, "processed": 5, "latency_p99_ms": 500.0}, ["latency"]),
        ({"produced": 5, "published": 5, "processed": 5, "latency_p99_ms": 499.99}, []),
        ({"produced": 5, "published": 5, "processed": 4, "lost_candidates": 1}, ["lost"]),
    ],
)
def test_prd_022_targets_at_their_edges(counts: dict[str, Any], breaches: list[str]) -> None:
    assert [name for name, _, _ in slo_checks(_row(**counts), Targets())] == breaches


def test_small_rows_skip_rate_verdicts_but_never_lost_events() -> None:
    row = _row(produced=2, published=1, lost_candidates=1)
    assert [n for n, _, _ in slo_checks(row, Targets(min_events=10))] == ["lost"]
    unsubscribed = _row(produced=3, published=3, handler_409=3, processed=1)
    unsubscribed["durable"] = NO_DURABLE
    assert slo_checks(unsubscribed, Targets()) == []


def _window(hours: int, **counts: Any) -> dict[str, Any]:
    row = _row(**counts)
    row["window_start"] = T0 + timedelta(hours=hours)
    return row


def test_dead_letter_spike_against_the_baseline_including_history() -> None:
    rules = AlertRules(baseline_windows=4, spike_factor=3.0, spike_min=5)
    history = [HistoryPoint(T0 - timedelta(hours=h), "sea", "d", 2, None) for h in range(1, 5)]
    rows = [_window(0, processed=999, dead_lettered=6), _window(1, processed=999, dead_lettered=7)]
    # Baseline 2: 6 is not above 3 x 2. The next window's baseline is (6 + 2 + 2 + 2) / 4 = 3.
    assert apply_alerts(rows, history, rules, window_seconds=HOUR) == []
    rows = [_window(0, processed=1000, dead_lettered=7)]
    fired = apply_alerts(rows, history, rules, window_seconds=HOUR)
    assert [(f.name, f.threshold) for f in fired] == [("dlq_spike", 6.0)]
    assert rows[0]["alerts"] == ["dlq_spike"]


def test_dead_letter_spike_needs_a_judged_baseline_and_the_floor() -> None:
    rules = AlertRules(baseline_windows=24, spike_factor=3.0, spike_min=5)
    # The very first window has nothing to compare with: no spike, however many.
    first = [_window(0, processed=10000, dead_lettered=50)]
    assert apply_alerts(first, [], rules, window_seconds=HOUR) == []
    # Judged windows with no dead letters are a baseline of 0 (only two of 24 known).
    quiet = [HistoryPoint(T0 - timedelta(hours=h), "sea", "d", 0, None) for h in (1, 2)]
    rows = [
        _window(0, processed=1000, dead_lettered=4),
        _window(1, processed=1000, dead_lettered=5),
    ]
    fired = apply_alerts(rows, quiet, rules, window_seconds=HOUR)
    assert [(f.name, f.window_start) for f in fired] == [("dlq_spike", T0 + timedelta(hours=1))]


def test_lag_must_be_sustained_over_consecutive_windows() -> None:
    rules = AlertRules(lag_ms=300_000, lag_windows=2)
    lags = [400_000.0, 10.0, 400_000.0, 301_000.0]
    rows = [_window(h, lag_p50_ms=lag) for h, lag in enumerate(lags)]
    fired = apply_alerts(rows, [], rules, window_seconds=HOUR)
    assert [(f.name, f.window_start) for f in fired] == [("lag_sustained", T0 + timedelta(hours=3))]
    history = [HistoryPoint(T0 - timedelta(hours=1), "sea", "d", 0, 900_000.0)]
    fired = apply_alerts([_window(0, lag_p50_ms=400_000.0)], history, rules, window_seconds=HOUR)
    assert [f.name for f in fired] == ["lag_sustained"]


def test_success_ratio_alert_and_exit_codes() -> None:
    rows = [_window(0, produced=10, published=10, processed=9, dead_lettered=1)]
    alerts = apply_alerts(rows, [], AlertRules(min_success_ratio=0.95), window_seconds=HOUR)
    assert [a.name for a in alerts] == ["success_ratio"]
    slos = apply_slos(rows, Targets(), scope="window")
    assert exit_code(slos, alerts) == EXIT_SLO_BREACH
    assert exit_code([], alerts) == EXIT_ALERT
    assert exit_code([], []) == EXIT_OK


def test_complete_windows_fills_the_grid() -> None:
    combos = [Combo("sea", "d", "*", "vib"), Combo("sea", "d", "s.v1", "vib")]
    counted = [{"window_start": T0, "context": "sea", "durable": "d", "subject": "s.v1",
                **empty_counts(), "produced": 3, "published": 3}]  # fmt: skip
    rows = complete_windows(counted, topology="t", windows=[T0, T0 + timedelta(hours=1)],
                            window_seconds=HOUR, combos=combos)  # fmt: skip
    assert len(rows) == 4
    assert [(r["subject"], r["produced"]) for r in rows] == [
        ("*", 0),
        ("s.v1", 3),
        ("*", 0),
        ("s.v1", 0),
    ]
    assert rows[1]["delivery_rate"] == 1.0 and rows[3]["delivery_rate"] is None
    assert rows[1]["window_end"] == T0 + timedelta(hours=1)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("java.lang.ClassNotFoundException: org.postgresql.Driver", JdbcDriverMissing),
        (
            "org.postgresql.util.PSQLException: Connection to 127.0.0.1:5 refused.",
            DatabaseUnreachable,
        ),
        ('org.postgresql.util.PSQLException: ERROR: relation "x" does not exist', SchemaMissing),
        ("java.lang.OutOfMemoryError: Java heap space", SparkFailed),
    ],
)
def test_spark_failures_map_to_the_job_errors(text: str, kind: type[Exception]) -> None:
    error = translate_spark_error(RuntimeError(f"An error occurred\n{text}\n\tat ..."))
    assert type(error) is kind


def test_the_demo_names_only_the_misses_it_does_not_cause(tmp_path: Path) -> None:
    from spark.demo import RETRIED_P99_MS, unexpected_misses

    def report(name: str, *findings: tuple[str, float]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        gate = [{"name": n, "value": v} for n, v in findings]
        (folder / "report.json").write_text(json.dumps({"findings": {"gate": gate}}))
        return folder / "report.html"

    on_purpose = report("a", ("dlq", 0.03), ("latency", RETRIED_P99_MS - 1))
    assert unexpected_misses([on_purpose]) == []
    slow = report("b", ("latency", RETRIED_P99_MS + 1), ("lost", 1.0))
    assert unexpected_misses([on_purpose, slow]) == ["latency", "lost"]
    assert unexpected_misses([tmp_path / "missing" / "report.html"]) is None
