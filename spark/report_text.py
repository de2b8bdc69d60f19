"""The terminal summary of a run (``summary.txt``) and the text helpers the HTML report shares."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark.kpis import Row
from spark.plan import ALL_SUBJECTS
from spark.report_model import OPEN_PLACES, Report, open_counts, waited_rows
from spark.verdicts import Finding


def pct(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


_COLUMNS_RIGHT = (
    ("produced", 9), ("deliv%", 8), ("dup%", 7), ("dlq%", 7), ("p50ms", 8), ("p95ms", 8),
    ("p99ms", 8), ("lost", 5), ("parked", 6),
)  # fmt: skip


def _text_table(rows: list[Row], critical: Sequence[str] = ()) -> list[str]:
    width = max([7, *(len(r["subject"]) for r in rows)])
    durable = max([7, *(len(marked(r["durable"], critical)) for r in rows)])
    head = f"{'context':<10} {'durable':<{durable}} {'subject':<{width}}"
    head += "".join(f" {name:>{w}}" for name, w in _COLUMNS_RIGHT) + "  verdict"
    out = [head]
    for row in rows:
        values = (
            str(row["produced"]), pct(row["delivery_rate"], 2), pct(row["duplicate_rate"], 2),
            pct(row["dlq_rate"], 2), ms(row["latency_p50_ms"]), ms(row["latency_p95_ms"]),
            ms(row["latency_p99_ms"]), str(row["lost_candidates"]), str(row["parked"]),
        )  # fmt: skip
        name = marked(row["durable"], critical)
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


def marked(durable: str, critical: Sequence[str]) -> str:
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


def describe(f: Finding) -> str:
    where = f"{f.context}/{f.durable}/{f.subject}"
    when = "run total" if f.window_start is None else f.window_start.strftime("%Y-%m-%d %H:%M:%S")
    return f"  {when:<19} {where}: {f.name} = {f.value:.6g} (threshold {f.threshold:.6g})"


def waited_lines(report: Report) -> list[str]:
    """The latency of events that waited for an operator, apart from the pipeline's own."""
    rows = critical_first(waited_rows(report.totals), report.critical)
    if not rows:
        return []
    lines = ["waited for an operator (replayed, or behind a held head): latency apart, not judged"]
    for r in rows:
        lines.append(
            f"  {r['context']}/{marked(r['durable'], report.critical)}: {r['waited']} events,"
            f" p99 {ms(r['waited_latency_p99_ms'])} ms, max {ms(r['waited_latency_max_ms'])} ms"
        )
    return lines


def open_line(report: Report) -> str:
    """Expected deliveries not final yet (none of them lost), or "" when there are none."""
    counts = open_counts(report.totals)
    shown = [f"{counts[column]} {label}" for column, label in OPEN_PLACES if counts[column]]
    return f"not final yet (not lost): {' · '.join(shown)}" if shown else ""


def _apart(lines: list[str]) -> list[str]:
    """``lines`` after a blank line, or nothing when they are empty."""
    shown = [line for line in lines if line]
    return ["", *shown] if shown else []


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
        lines += _apart(waited_lines(report)) + _apart([open_line(report)])
    for title, findings in (
        ("targets missed (gate)", summary_findings(report.gate_findings)),
        ("INFRA-005 alerts", summary_findings(report.alerts)),
    ):
        findings = critical_first(findings, report.critical)
        if findings:
            lines += ["", f"{title}: {len(findings)}", *(describe(f) for f in findings[:12])]
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
