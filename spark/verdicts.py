"""Verdicts: PRD-022's targets and INFRA-005 §6's P0 alert conditions (pure).

PRD-022 targets, per row (a window row, or a run total):

==============  =============================================  =====================
``lost``        lost deliveries (place ``lost``: never a        must be 0 (always checked)
                parked, retrying or in-flight one)
``delivery``    delivery rate                                   >= 99.99 %
``duplicates``  duplicate-processing rate                       <= 0 %
``dlq``         dead-letter rate                                < 0.1 %
``latency``     end-to-end latency p99, the pipeline's own      < 500 ms
                (events that waited for an operator apart)
==============  =============================================  =====================

Rows with fewer events than ``min_events`` get no rate verdicts; rows of events nobody
subscribes to (durable ``-``) only the delivery rate.

INFRA-005 P0 alerts, per window and durable (its roll-up row ``*``):

==================  ===============================================================
``lag_sustained``   median consumer lag above the threshold in N consecutive windows
``dlq_spike``       dead letters >= a floor and > factor x the mean of the previous
                    B windows that were judged (by this run or an earlier one, read back
                    from the KPI table); with none judged yet there is no baseline and
                    no spike (the first hours of a deployment are not a spike)
``success_ratio``   processed / (processed + dead-lettered) below the threshold
==================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from spark.errors import EXIT_ALERT, EXIT_OK, EXIT_SLO_BREACH
from spark.kpis import Row
from spark.plan import ALL_SUBJECTS, NO_DURABLE
from spark.settings import KpiSettings


@dataclass(frozen=True, slots=True)
class Targets:
    """PRD-022 targets (defaults from the PRD; each one a setting)."""

    delivery_min: float = 0.9999
    duplicate_max: float = 0.0
    dlq_max: float = 0.001
    p99_max_ms: float = 500.0
    min_events: int = 1

    @classmethod
    def from_settings(cls, s: KpiSettings) -> Targets:
        """The targets ``s`` configures."""
        return cls(
            s.kpi_delivery_target, s.kpi_duplicate_max, s.kpi_dlq_max, s.kpi_p99_max_ms,
            s.kpi_min_events,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class AlertRules:
    """INFRA-005 §6 P0 alert conditions."""

    lag_ms: float = 300_000.0
    lag_windows: int = 1
    baseline_windows: int = 24
    spike_factor: float = 3.0
    spike_min: int = 10
    min_success_ratio: float = 0.99

    @classmethod
    def from_settings(cls, s: KpiSettings) -> AlertRules:
        """The rules ``s`` configures."""
        return cls(
            s.kpi_lag_alert * 1000.0, s.kpi_lag_sustained_windows, s.kpi_baseline_windows,
            s.kpi_dlq_spike_factor, s.kpi_dlq_spike_min, s.kpi_min_success_ratio,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    """One breached target or fired alert, for the reports."""

    kind: str  # "slo" or "alert"
    name: str
    scope: str  # "window" or "total"
    window_start: datetime | None
    context: str
    durable: str
    subject: str
    value: float
    threshold: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "kind": self.kind,
            "name": self.name,
            "scope": self.scope,
            "window_start": None if self.window_start is None else self.window_start.isoformat(),
            "context": self.context,
            "durable": self.durable,
            "subject": self.subject,
            "value": self.value,
            "threshold": self.threshold,
        }


def slo_checks(row: Row, t: Targets) -> list[tuple[str, float, float]]:
    """(target name, value, threshold) of every target ``row`` misses."""
    out: list[tuple[str, float, float]] = []
    if row["lost_candidates"] > 0:
        out.append(("lost", float(row["lost_candidates"]), 0.0))
    if row["produced"] < t.min_events:
        return out
    rate = row["delivery_rate"]
    if rate is not None and rate < t.delivery_min:
        out.append(("delivery", rate, t.delivery_min))
    if row["durable"] == NO_DURABLE:
        return out
    dup = row["duplicate_rate"]
    if dup is not None and dup > t.duplicate_max:
        out.append(("duplicates", dup, t.duplicate_max))
    dlq = row["dlq_rate"]
    if dlq is not None and dlq >= t.dlq_max:
        out.append(("dlq", dlq, t.dlq_max))
    p99 = row["latency_p99_ms"]
    if p99 is not None and p99 >= t.p99_max_ms:
        out.append(("latency", p99, t.p99_max_ms))
    return out


def apply_slos(rows: list[Row], t: Targets, *, scope: str) -> list[Finding]:
    """Set each row's ``slo_breaches``; return the findings."""
    findings = []
    for row in rows:
        checks = slo_checks(row, t)
        row["slo_breaches"] = [name for name, _, _ in checks]
        findings += [
            Finding("slo", name, scope, row.get("window_start"), row["context"], row["durable"],
                    row["subject"], value, threshold)
            for name, value, threshold in checks
        ]  # fmt: skip
    return findings


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """A durable's roll-up row of an earlier window (from the KPI table)."""

    window_start: datetime
    context: str
    durable: str
    dead_lettered: int
    lag_p50_ms: float | None


def _series(
    rows: list[Row], history: Iterable[HistoryPoint]
) -> dict[tuple[str, str], dict[datetime, tuple[int, float | None]]]:
    series: dict[tuple[str, str], dict[datetime, tuple[int, float | None]]] = {}
    for h in history:
        series.setdefault((h.context, h.durable), {})[h.window_start] = (
            h.dead_lettered,
            h.lag_p50_ms,
        )
    for r in rows:
        series.setdefault((r["context"], r["durable"]), {})[r["window_start"]] = (
            r["dead_lettered"], r["lag_p50_ms"],
        )  # fmt: skip
    return series


def _lag_streak(
    points: dict[datetime, tuple[int, float | None]],
    start: datetime,
    step: timedelta,
    limit: float,
    need: int,
) -> int:
    streak, moment = 0, start
    while streak < need:
        lag = points.get(moment, (0, None))[1]
        if lag is None or lag <= limit:
            break
        streak += 1
        moment -= step
    return streak


def _baseline(
    points: dict[datetime, tuple[int, float | None]], start: datetime, step: timedelta, n: int
) -> float | None:
    """Mean dead letters of the judged windows among the ``n`` before ``start``, if any."""
    known = [points[m][0] for k in range(1, n + 1) if (m := start - step * k) in points]
    return sum(known) / len(known) if known else None


def apply_alerts(
    rows: list[Row], history: Iterable[HistoryPoint], rules: AlertRules, *, window_seconds: int
) -> list[Finding]:
    """Set the ``alerts`` of each durable roll-up row; return the findings."""
    durable_rows = [r for r in rows if r["subject"] == ALL_SUBJECTS and r["durable"] != NO_DURABLE]
    series = _series(durable_rows, history)
    step = timedelta(seconds=window_seconds)
    findings = []
    for row in sorted(durable_rows, key=lambda r: r["window_start"]):
        points = series[(row["context"], row["durable"])]
        fired: list[tuple[str, float, float]] = []
        if (
            _lag_streak(points, row["window_start"], step, rules.lag_ms, rules.lag_windows)
            >= rules.lag_windows
        ):
            fired.append(("lag_sustained", row["lag_p50_ms"], rules.lag_ms))
        baseline = _baseline(points, row["window_start"], step, rules.baseline_windows)
        dead = row["dead_lettered"]
        if (
            baseline is not None
            and dead >= rules.spike_min
            and dead > rules.spike_factor * baseline
        ):
            fired.append(
                (
                    "dlq_spike",
                    float(dead),
                    max(float(rules.spike_min), rules.spike_factor * baseline),
                )
            )
        ratio = row["success_ratio"]
        if ratio is not None and ratio < rules.min_success_ratio:
            fired.append(("success_ratio", ratio, rules.min_success_ratio))
        row["alerts"] = [name for name, _, _ in fired]
        findings += [
            Finding("alert", name, "window", row["window_start"], row["context"], row["durable"],
                    ALL_SUBJECTS, value, threshold)
            for name, value, threshold in fired
        ]  # fmt: skip
    return findings


def exit_code(gate: list[Finding], alerts: list[Finding]) -> int:
    """1 when a gating target is missed, else 4 when an alert fired, else 0."""
    if gate:
        return EXIT_SLO_BREACH
    return EXIT_ALERT if alerts else EXIT_OK


def verdict_word(code: int) -> str:
    """A one-word verdict for humans and the runs table."""
    return {EXIT_OK: "pass", EXIT_SLO_BREACH: "breach", EXIT_ALERT: "alert"}.get(code, "error")
