"""The reports of one run: JSON (machines), text (the terminal), HTML with PNG plots (people).

Written to ``FERRY_KPI_REPORT_DIR/<topology>/<run>/`` (``report.json``, ``report.html``,
``summary.txt``, ``latency.png``, ``windows.png``), with ``<topology>/latest`` pointing at
the newest run. The plots are drawn on matplotlib's Agg canvas directly (no pyplot, no
global state, no display needed).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spark.kpis import Row
from spark.plan import ALL_SUBJECTS, NO_DURABLE
from spark.transforms import HIST_BINS_PER_DECADE
from spark.verdicts import AlertRules, Finding, Targets

#: Rows of the per-window table shown in the HTML report before it is folded away.
HTML_WINDOW_ROWS = 500


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
        doc: dict[str, Any] = _jsonable(
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
                "totals": self.totals,
                "windows": self.windows,
                "reasons": self.reasons,
                "latency_histogram": self.histogram,
            }
        )
        return doc


def vars_of(obj: Any) -> dict[str, Any]:
    """A slotted dataclass as a dict."""
    return {name: getattr(obj, name) for name in obj.__slots__}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---- text


def _pct(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


_COLUMNS_RIGHT = (
    ("produced", 9), ("deliv%", 8), ("dup%", 7), ("dlq%", 7), ("p50ms", 8), ("p95ms", 8),
    ("p99ms", 8), ("lost", 5),
)  # fmt: skip


def _text_table(rows: list[Row], critical: Sequence[str] = ()) -> list[str]:
    width = max([7, *(len(r["subject"]) for r in rows)])
    durable = max([7, *(len(_marked(r["durable"], critical)) for r in rows)])
    head = f"{'context':<10} {'durable':<{durable}} {'subject':<{width}}"
    head += "".join(f" {name:>{w}}" for name, w in _COLUMNS_RIGHT) + "  verdict"
    out = [head]
    for row in rows:
        values = (
            str(row["produced"]), _pct(row["delivery_rate"], 2), _pct(row["duplicate_rate"], 2),
            _pct(row["dlq_rate"], 2), _ms(row["latency_p50_ms"]), _ms(row["latency_p95_ms"]),
            _ms(row["latency_p99_ms"]), str(row["lost_candidates"]),
        )  # fmt: skip
        name = _marked(row["durable"], critical)
        line = f"{row['context']:<10} {name:<{durable}} {row['subject']:<{width}}"
        line += "".join(f" {v:>{w}}" for v, (_, w) in zip(values, _COLUMNS_RIGHT, strict=True))
        out.append(line + "  " + (", ".join(row["slo_breaches"]) or "ok"))
    return out


def critical_first(rows: list[Any], critical: Sequence[str]) -> list[Any]:
    """``rows`` (KPI rows or findings) with the critical durables' first, each group in
    its own order."""
    high = set(critical)

    def durable(row: Any) -> str:
        return str(row["durable"] if isinstance(row, dict) else row.durable)

    return sorted(rows, key=lambda row: durable(row) not in high)


def _marked(durable: str, critical: Sequence[str]) -> str:
    return f"{durable} [high]" if durable in critical else durable


def summary_rows(totals: list[Row]) -> list[Row]:
    """Totals worth a line: each durable's roll-up, its subjects only when it has several."""
    subjects: dict[tuple[str, str], int] = {}
    for row in totals:
        if row["subject"] != ALL_SUBJECTS:
            key = (row["context"], row["durable"])
            subjects[key] = subjects.get(key, 0) + 1
    return [
        r
        for r in totals
        if r["subject"] == ALL_SUBJECTS or subjects.get((r["context"], r["durable"]), 0) > 1
    ]


def summary_findings(findings: list[Finding]) -> list[Finding]:
    """Findings without a subject's repeat of its durable's roll-up finding."""
    rolled = {(f.name, f.window_start, f.context, f.durable) for f in findings
              if f.subject == ALL_SUBJECTS}  # fmt: skip
    return [
        f
        for f in findings
        if f.subject == ALL_SUBJECTS or (f.name, f.window_start, f.context, f.durable) not in rolled
    ]


def _describe(f: Finding) -> str:
    where = f"{f.context}/{f.durable}/{f.subject}"
    when = "run total" if f.window_start is None else f.window_start.strftime("%Y-%m-%d %H:%M:%S")
    return f"  {when:<19} {where}: {f.name} = {f.value:.6g} (threshold {f.threshold:.6g})"


def text_summary(report: Report, report_dir: Path | None) -> str:
    """The terminal summary: the verdict, run totals per durable and subject, findings."""
    span = (
        "no new complete window"
        if report.start is None or report.end is None
        else f"{report.start:%Y-%m-%d %H:%M:%S} → {report.end:%Y-%m-%d %H:%M:%S} UTC"
        + (" (incremental)" if report.incremental else " (explicit range)")
    )
    lines = [
        f"KPI report · topology {report.topology} · {report.window_seconds}s windows · {span}",
        f"verdict: {report.verdict.upper()} (exit {report.exit_code}) · gate: "
        f"{'run totals' if report.gate == 'total' else 'every window'} · "
        f"{report.events} events · {report.duration_seconds:.1f}s",
    ]
    if report.note:
        lines.append(report.note)
    if report.totals:
        rows = critical_first(summary_rows(report.totals), report.critical)
        lines += ["", *_text_table(rows, report.critical)]
    for title, findings in (
        ("targets missed (gate)", summary_findings(report.gate_findings)),
        ("INFRA-005 alerts", summary_findings(report.alerts)),
    ):
        findings = critical_first(findings, report.critical)
        if findings:
            lines += ["", f"{title}: {len(findings)}", *(_describe(f) for f in findings[:12])]
            if len(findings) > 12:
                lines.append(f"  ... and {len(findings) - 12} more (report.json)")
    if report.other_findings:
        scope = "window" if report.gate == "total" else "run-total"
        lines += ["", f"{scope} rows missing a target (not gating): {len(report.other_findings)}"
                  " (report.html, report.json)"]  # fmt: skip
    if report.lost_count:
        lines += ["", f"lost candidates: {report.lost_count} (ids in report.json)"]
    if report_dir is not None:
        lines += ["", f"report: {report_dir / 'report.html'}"]
    return "\n".join(lines)


# ---- plots


def _durable_label(row: Row) -> str:
    return f"{row['context']}→{row['durable']}"


def plot_latency(report: Report, path: Path) -> None:
    """Latency distribution per durable (log scale) with its p50/p95/p99 and the target."""
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
    ax.set_ylabel("processed deliveries")
    ax.set_title(f"Latency distribution · {report.topology} · {_range_text(report)}")
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


def _range_text(report: Report) -> str:
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
    _panel(axes[1], series, "latency_p99_ms", 1.0, "end-to-end latency p99 (ms)", log=True)
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


# ---- HTML

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f0f0f0} td.k{text-align:left}
.pass{background:#d8f5d8} .breach{background:#f8d0d0} .alert{background:#fbeec0}
.banner{padding:.6em 1em;font-size:1.3em;border-radius:4px;display:inline-block}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
tr.high td.k{font-weight:bold}
"""
_HTML_COLUMNS = (
    ("produced", "produced", str),
    ("published", "published", str),
    ("processed", "processed", str),
    ("dead_lettered", "dead-lettered", str),
    ("duplicate_deliveries", "dup. skipped", str),
    ("handler_409", "409s", str),
    ("retries", "retries", str),
    ("lost_candidates", "lost", str),
    ("delivery_rate", "delivery %", lambda v: _pct(v, 3)),
    ("duplicate_rate", "duplicate %", lambda v: _pct(v, 3)),
    ("dlq_rate", "DLQ %", lambda v: _pct(v, 3)),
    ("success_ratio", "success %", lambda v: _pct(v, 2)),
    ("latency_p50_ms", "p50 ms", _ms),
    ("latency_p95_ms", "p95 ms", _ms),
    ("latency_p99_ms", "p99 ms", _ms),
    ("lag_p50_ms", "lag p50 ms", _ms),
)


def _cell(text: str, cls: str = "") -> str:
    return f'<td class="{cls}">{html.escape(text)}</td>'


def _html_table(rows: list[Row], *, with_window: bool, critical: Sequence[str] = ()) -> str:
    head = ["window"] if with_window else []
    head += ["context", "durable", "subject"] + [title for _, title, _ in _HTML_COLUMNS]
    head += ["verdict"]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        marks = row["slo_breaches"] + row["alerts"]
        cls = "breach" if row["slo_breaches"] else ("alert" if row["alerts"] else "")
        cls += " high" if row["durable"] in critical else ""
        cells = [_cell(f"{row['window_start']:%Y-%m-%d %H:%M:%S}", "k")] if with_window else []
        cells += [_cell(str(row["context"]), "k"), _cell(_marked(row["durable"], critical), "k")]
        cells.append(_cell(str(row["subject"]), "k"))
        cells += [_cell(fmt(row[key])) for key, _, fmt in _HTML_COLUMNS]
        cells.append(_cell(", ".join(marks) or "ok", "k"))
        out.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>")
    return "\n".join([*out, "</table>"])


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def _findings_html(title: str, findings: list[Finding]) -> str:
    if not findings:
        return ""
    items = "".join(f"<li>{html.escape(_describe(f).strip())}</li>" for f in findings[:200])
    return f"<h3>{html.escape(title)} ({len(findings)})</h3><ul>{items}</ul>"


def _reasons_html(reasons: list[Row]) -> str:
    totals: dict[tuple[str, str, str], int] = {}
    for r in reasons:
        if r["subject"] == ALL_SUBJECTS:
            key = (r["durable"], r["kind"], r["reason_code"])
            totals[key] = totals.get(key, 0) + int(r["count"])
    if not totals:
        return "<p>No retries, no dead letters.</p>"
    rows = "".join(
        f"<tr>{_cell(d, 'k')}{_cell(k, 'k')}{_cell(c, 'k')}{_cell(str(n))}</tr>"
        for (d, k, c), n in sorted(totals.items())
    )
    return (
        f"<table><tr><th>durable</th><th>kind</th><th>reason</th><th>count</th></tr>{rows}</table>"
    )


def render_html(report: Report, latency_png: Path, windows_png: Path) -> str:
    """The standalone HTML report (plots embedded)."""
    high = report.critical
    per_window = [r for r in report.windows if r["subject"] == ALL_SUBJECTS]
    folded = len(per_window) > HTML_WINDOW_ROWS
    lost = "".join(
        f"<li>{html.escape(json.dumps(_jsonable(item)))}</li>" for item in report.lost_listed[:100]
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Ferry KPIs · "
        f"{html.escape(report.topology)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Ferry KPI report · {html.escape(report.topology)}</h1>",
        f'<p class="banner {html.escape(report.verdict)}">verdict: '
        f"{html.escape(report.verdict.upper())} (exit {report.exit_code})</p>",
        f"<p>{html.escape(_range_text(report))} · {report.window_seconds}s windows · "
        f"as of {report.as_of:%Y-%m-%d %H:%M:%S} UTC · gate: {html.escape(report.gate)} · "
        f"{report.events} events · run {html.escape(report.run_id)}</p>",
        f"<p>{html.escape(report.note)}</p>" if report.note else "",
        _findings_html("Targets missed (gate)", critical_first(report.gate_findings, high)),
        _findings_html("Targets missed (not gating)", critical_first(report.other_findings, high)),
        _findings_html("INFRA-005 alerts", critical_first(report.alerts, high)),
        "<h2>Run totals</h2>",
        f"<p>Critical lanes (criticality: high) first, marked [high]: {', '.join(high)}</p>"
        if high
        else "",
        _html_table(critical_first(report.totals, high), with_window=False, critical=high),
        "<h2>Latency distribution</h2>",
        _img(latency_png),
        "<h2>KPIs per window</h2>",
        _img(windows_png),
        "<h2>Per window and durable</h2>",
        "<details><summary>table</summary>" if folded else "",
        _html_table(critical_first(per_window, high), with_window=True, critical=high),
        "</details>" if folded else "",
        "<h2>Retries and dead letters by reason</h2>",
        _reasons_html(report.reasons),
        f"<h2>Lost candidates ({report.lost_count})</h2><ul>{lost}</ul>"
        if report.lost_count
        else "",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


# ---- files


def run_directory(base: Path, topology: str, as_of: datetime, run_id: str) -> Path:
    """Where one run's report goes."""
    return base / topology / f"{as_of:%Y%m%dT%H%M%SZ}-{run_id[:8]}"


def write_report(report: Report, directory: Path, *, keep: int) -> Path:
    """Write every file of ``report`` into ``directory``; point ``latest`` at it; prune."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    plot_latency(report, directory / "latency.png")
    plot_windows(report, directory / "windows.png")
    (directory / "report.html").write_text(
        render_html(report, directory / "latency.png", directory / "windows.png")
    )
    (directory / "summary.txt").write_text(text_summary(report, directory) + "\n")
    _point_latest(directory)
    _prune(directory.parent, keep)
    return directory


def _point_latest(directory: Path) -> None:
    link = directory.parent / "latest"
    temp = directory.parent / f".latest-{os.getpid()}"
    temp.unlink(missing_ok=True)
    temp.symlink_to(directory.name)
    os.replace(temp, link)


def _prune(parent: Path, keep: int) -> None:
    runs = sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink())
    for old in runs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def histogram_entries(counted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spark's (context, durable, bin, count) rows as one entry per durable with bin edges."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in counted:
        low = 10 ** (row["bin"] / HIST_BINS_PER_DECADE)
        high = 10 ** ((row["bin"] + 1) / HIST_BINS_PER_DECADE)
        out.setdefault((row["context"], row["durable"]), []).append(
            {"bin": row["bin"], "low_ms": low, "high_ms": high, "count": row["count"]}
        )
    return [
        {"context": c, "durable": d, "bins": sorted(bins, key=lambda b: b["bin"])}
        for (c, d), bins in sorted(out.items())
    ]
