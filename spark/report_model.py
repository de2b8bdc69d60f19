"""The report of one run as data: the ``Report`` record and its JSON document (``report.json``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spark.kpis import Row
from spark.plan import ALL_SUBJECTS
from spark.verdicts import AlertRules, Finding, Targets

#: Places of expected deliveries that are not final yet (none of them lost), as counted.
OPEN_PLACES = (("parked", "parked"), ("retrying", "retrying"), ("in_flight", "in flight"))


@dataclass
class Report:
    """Everything a run reports."""

    run_id: str
    topology: str
    as_of: datetime
    start: datetime | None
    end: datetime | None
    incremental: bool
    window_seconds: int
    grace_seconds: float
    kpi_database: str
    gate: str
    targets: Targets
    rules: AlertRules
    exit_code: int
    verdict: str
    duration_seconds: float = 0.0
    events: int = 0
    windows: list[Row] = field(default_factory=list)
    totals: list[Row] = field(default_factory=list)
    reasons: list[Row] = field(default_factory=list)
    gate_findings: list[Finding] = field(default_factory=list)
    other_findings: list[Finding] = field(default_factory=list)
    alerts: list[Finding] = field(default_factory=list)
    lost_count: int = 0
    lost_listed: list[dict[str, Any]] = field(default_factory=list)
    histogram: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    #: Seconds per phase of the run (check, spark, judge_and_write) before the report.
    timings: dict[str, float] = field(default_factory=dict)
    #: Durables declared ``criticality: high`` (INFRA-005 §7): listed first, marked.
    critical: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (timestamps as ISO 8601, NaN-free)."""
        doc: dict[str, Any] = jsonable(
            {
                "run_id": self.run_id,
                "topology": self.topology,
                "as_of": self.as_of,
                "range": {"start": self.start, "end": self.end, "incremental": self.incremental},
                "window_seconds": self.window_seconds,
                "grace_seconds": self.grace_seconds,
                "kpi_database": self.kpi_database,
                "gate": self.gate,
                "targets": vars_of(self.targets),
                "alert_rules": vars_of(self.rules),
                "verdict": self.verdict,
                "exit_code": self.exit_code,
                "note": self.note,
                "duration_seconds": round(self.duration_seconds, 3),
                "timings": self.timings,
                "critical_durables": self.critical,
                "events": self.events,
                "findings": {
                    "gate": [f.as_dict() for f in self.gate_findings],
                    "other_slo": [f.as_dict() for f in self.other_findings],
                    "alerts": [f.as_dict() for f in self.alerts],
                },
                "lost_candidates": {"count": self.lost_count, "listed": self.lost_listed},
                "not_final": open_counts(self.totals),
                "waited_for_operator": waited_rows(self.totals),
                "totals": self.totals,
                "windows": self.windows,
                "reasons": self.reasons,
                "latency_histogram": self.histogram,
            }
        )
        return doc


def open_counts(totals: list[Row]) -> dict[str, int]:
    """Expected deliveries not final yet, by place (parked, retrying, in_flight), over the
    durables' roll-up totals."""
    rolled = [r for r in totals if r["subject"] == ALL_SUBJECTS]
    return {column: sum(int(r.get(column) or 0) for r in rolled) for column, _ in OPEN_PLACES}


def waited_rows(totals: list[Row]) -> list[dict[str, Any]]:
    """Per durable (roll-up totals): the processed events that waited for an operator
    (replayed after a dead letter, or released from behind a held head) and their
    latency, which the pipeline's own latency columns leave out."""
    return [
        {
            "context": r["context"],
            "durable": r["durable"],
            "waited": r["waited"],
            "waited_latency_p99_ms": r["waited_latency_p99_ms"],
            "waited_latency_max_ms": r["waited_latency_max_ms"],
        }
        for r in totals
        if r["subject"] == ALL_SUBJECTS and r.get("waited")
    ]


def vars_of(obj: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    return {name: getattr(obj, name) for name in obj.__slots__}


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
