"""KPI rows: Spark's counts completed into the full window grid, with the rates (pure).

Rates follow PRD-022's measurement methods, with the issue's definitions:

==================  ===============================================================
delivery_rate       published / produced                    (outbox published / total)
duplicate_rate      (duplicate deliveries skipped + handler 409s) / processed
dlq_rate            dead-lettered / produced                (DLQ count / total)
retry_rate          retries / produced
success_ratio       processed / (processed + dead-lettered)  (per worker = per durable)
==================  ===============================================================

A rate whose denominator is zero is ``None`` ("no data"), never 0 or 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from spark.plan import Combo
from spark.transforms import COUNT_COLUMNS, MEASURE_COLUMNS

Row = dict[str, Any]

RATE_COLUMNS = ("delivery_rate", "duplicate_rate", "dlq_rate", "retry_rate", "success_ratio")
#: Every column of kpi_windows after the key, in table order.
WINDOW_COLUMNS = (
    "topology",
    "window_seconds",
    "window_start",
    "window_end",
    "context",
    "durable",
    "subject",
    "target_context",
    *COUNT_COLUMNS,
    *RATE_COLUMNS,
    *MEASURE_COLUMNS,
    "slo_breaches",
    "alerts",
)
REASON_COLUMNS = (
    "topology",
    "window_seconds",
    "window_start",
    "context",
    "durable",
    "subject",
    "kind",
    "reason_code",
    "count",
    "rate",
)


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else numerator / denominator


def with_rates(row: Row) -> Row:
    """``row`` plus its rates (computed from its counts)."""
    produced, processed, dead = row["produced"], row["processed"], row["dead_lettered"]
    row["delivery_rate"] = _ratio(row["published"], produced)
    row["duplicate_rate"] = _ratio(row["duplicate_deliveries"] + row["handler_409"], processed)
    row["dlq_rate"] = _ratio(dead, produced)
    row["retry_rate"] = _ratio(row["retries"], produced)
    row["success_ratio"] = _ratio(processed, processed + dead)
    return row


def empty_counts() -> Row:
    """The counts and measures of a key that saw no event."""
    return {**dict.fromkeys(COUNT_COLUMNS, 0), **dict.fromkeys(MEASURE_COLUMNS)}


def _key(context: str, durable: str, subject: str) -> tuple[str, str, str]:
    return (context, durable, subject)


def complete_windows(
    counted: Iterable[Mapping[str, Any]],
    *,
    topology: str,
    windows: list[datetime],
    window_seconds: int,
    combos: list[Combo],
) -> list[Row]:
    """Every (window, combo) row: Spark's where there were events, zeros elsewhere.

    ``combos`` should come from :meth:`spark.plan.Plan.combos` with the keys seen in
    ``counted``, so an event kind missing from the manifests still gets its rows.
    """
    by_key = {
        (r["window_start"], *_key(r["context"], r["durable"], r["subject"])): r for r in counted
    }
    step = timedelta(seconds=window_seconds)
    rows = []
    for start in windows:
        for combo in combos:
            found = by_key.get((start, *_key(combo.context, combo.durable, combo.subject)))
            row: Row = {
                "topology": topology,
                "window_seconds": window_seconds,
                "window_start": start,
                "window_end": start + step,
                "context": combo.context,
                "durable": combo.durable,
                "subject": combo.subject,
                "target_context": combo.target_context,
            }
            row.update(empty_counts())
            if found is not None:
                row.update({k: found[k] for k in (*COUNT_COLUMNS, *MEASURE_COLUMNS)})
            row["slo_breaches"], row["alerts"] = [], []
            rows.append(with_rates(row))
    return rows


def combos_seen(counted: Iterable[Mapping[str, Any]]) -> list[Combo]:
    """The keys Spark reported (to add to the topology's combos)."""
    return sorted(
        {Combo(r["context"], r["durable"], r["subject"], r["target_context"]) for r in counted},
        key=lambda c: (c.context, c.durable, c.subject),
    )


def total_rows(counted: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Run totals with rates, sorted by key."""
    rows = []
    for found in counted:
        row: Row = {k: found[k] for k in ("context", "durable", "subject", "target_context")}
        row.update({k: found[k] for k in (*COUNT_COLUMNS, *MEASURE_COLUMNS)})
        row["slo_breaches"], row["alerts"] = [], []
        rows.append(with_rates(row))
    return sorted(rows, key=lambda r: (r["context"], r["durable"], r["subject"]))


def reason_rows(
    counted: Iterable[Mapping[str, Any]],
    windows: list[Row],
    *,
    topology: str,
    window_seconds: int,
) -> list[Row]:
    """Reason counts with their rate over the row's produced events."""
    produced = {
        (w["window_start"], w["context"], w["durable"], w["subject"]): w["produced"]
        for w in windows
    }
    rows = []
    for found in counted:
        key = (found["window_start"], found["context"], found["durable"], found["subject"])
        rows.append(
            {
                "topology": topology,
                "window_seconds": window_seconds,
                **{k: found[k] for k in ("window_start", "context", "durable", "subject")},
                "kind": found["kind"],
                "reason_code": found["reason_code"],
                "count": found["count"],
                "rate": _ratio(found["count"], produced.get(key, 0)),
            }
        )
    return sorted(
        rows,
        key=lambda r: (
            r["window_start"],
            r["context"],
            r["durable"],
            r["subject"],
            r["kind"],
            r["reason_code"],
        ),
    )
