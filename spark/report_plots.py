"""The PNG plots of a run (``latency.png``, ``windows.png``), drawn on matplotlib's Agg canvas
directly (no pyplot, no global state, no display needed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spark.kpis import Row
from spark.plan import ALL_SUBJECTS, NO_DURABLE
from spark.report_model import Report
from spark.transforms import HIST_BINS_PER_DECADE


def _durable_label(row: Row) -> str:
    return f"{row['context']}→{row['durable']}"


def plot_latency(report: Report, path: Path) -> None:
    """The pipeline's own latency distribution per durable (log scale: events that waited
    for an operator left out) with its p50/p95/p99 and the target."""
    fig = _figure(10, 5.5)
    ax = fig.add_subplot()
    totals = {
        (r["context"], r["durable"]): r for r in report.totals if r["subject"] == ALL_SUBJECTS
    }
    for entry in report.histogram:
        edges, counts = _contiguous(entry["bins"])
        label = f"{entry['context']}→{entry['durable']}"
        total = totals.get((entry["context"], entry["durable"]))
        if total and total["latency_p99_ms"] is not None:
            label += (
                f" (p50 {total['latency_p50_ms']:.1f}, p95 {total['latency_p95_ms']:.1f}, "
                f"p99 {total['latency_p99_ms']:.1f} ms)"
            )
        artist = ax.stairs(counts, edges, label=label, linewidth=1.5)
        if total and total["latency_p99_ms"] is not None:
            color = artist.get_edgecolor()
            ax.axvline(max(total["latency_p99_ms"], 1e-3), color=color, linestyle=":", linewidth=1)
    ax.axvline(report.targets.p99_max_ms, color="red", linestyle="--", label="p99 target")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (occurred_at in source → processed_at in target)")
    ax.set_ylabel("processed deliveries (not those that waited for an operator)")
    ax.set_title(f"Latency distribution · {report.topology} · {range_text(report)}")
    if report.histogram:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no processed deliveries", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _contiguous(bins: list[dict[str, Any]]) -> tuple[list[float], list[int]]:
    """Edges and counts over every bin from the lowest to the highest (gaps count 0)."""
    counts = {b["bin"]: b["count"] for b in bins}
    numbers = range(min(counts), max(counts) + 1)
    edges = [10 ** (n / HIST_BINS_PER_DECADE) for n in [*numbers, max(counts) + 1]]
    return edges, [counts.get(n, 0) for n in numbers]


def range_text(report: Report) -> str:
    if report.start is None or report.end is None:
        return "no data"
    return f"{report.start:%Y-%m-%d %H:%M:%S} → {report.end:%Y-%m-%d %H:%M:%S} UTC"


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    series: dict[str, list[Row]] = {}
    for row in rows:
        if row["subject"] == ALL_SUBJECTS and row["durable"] != NO_DURABLE:
            series.setdefault(_durable_label(row), []).append(row)
    return {k: sorted(v, key=lambda r: r["window_start"]) for k, v in sorted(series.items())}


def _panel(
    ax: Any,
    series: dict[str, list[Row]],
    column: str,
    scale: float,
    title: str,
    *,
    log: bool = False,
) -> None:
    for label, rows in series.items():
        xs = [r["window_start"] for r in rows]
        ys = [_point(r[column], scale, log=log) for r in rows]
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
        bad = [(r["window_start"], y) for r, y in zip(rows, ys, strict=True)
               if (r["slo_breaches"] or r["alerts"]) and not math.isnan(y)]  # fmt: skip
        if bad:
            ax.scatter(*zip(*bad, strict=True), color="red", zorder=3, s=18)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    if log:
        ax.set_yscale("log")


def _point(value: float | None, scale: float, *, log: bool) -> float:
    if value is None or (log and value <= 0):
        return math.nan
    return float(value) * scale


def plot_windows(report: Report, path: Path) -> None:
    """KPIs per window and durable: volume, p99, dead-letter rate, lag (breaches in red)."""
    series = _series(report.windows)
    fig = _figure(11, 10)
    axes = fig.subplots(4, 1, sharex=True)
    _panel(axes[0], series, "produced", 1.0, "events per window")
    _panel(axes[1], series, "latency_p99_ms", 1.0, "own end-to-end latency p99 (ms)", log=True)
    axes[1].axhline(report.targets.p99_max_ms, color="red", linestyle="--", linewidth=1)
    _panel(axes[2], series, "dlq_rate", 100.0, "dead-letter rate (%)")
    axes[2].axhline(report.targets.dlq_max * 100, color="red", linestyle="--", linewidth=1)
    _panel(
        axes[3], series, "lag_p50_ms", 1.0, "consumer lag, median publish → receipt (ms)", log=True
    )
    axes[3].axhline(report.rules.lag_ms, color="red", linestyle="--", linewidth=1)
    if series:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"KPIs per window · {report.topology} · {report.window_seconds}s windows")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
