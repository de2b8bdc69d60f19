"""The standalone HTML report of a run (``report.html``, plots embedded)."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path

from spark.kpis import Row
from spark.plan import ALL_SUBJECTS
from spark.report_model import Report, jsonable, waited_rows
from spark.report_plots import range_text
from spark.report_text import critical_first, describe, marked, ms, open_line, pct
from spark.verdicts import Finding

#: Rows of the per-window table shown in the HTML report before it is folded away.
HTML_WINDOW_ROWS = 500

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
    ("parked", "parked", str),
    ("retrying", "retrying", str),
    ("in_flight", "in flight", str),
    ("delivery_rate", "delivery %", lambda v: pct(v, 3)),
    ("duplicate_rate", "duplicate %", lambda v: pct(v, 3)),
    ("dlq_rate", "DLQ %", lambda v: pct(v, 3)),
    ("success_ratio", "success %", lambda v: pct(v, 2)),
    ("latency_p50_ms", "p50 ms", ms),
    ("latency_p95_ms", "p95 ms", ms),
    ("latency_p99_ms", "p99 ms", ms),
    ("waited", "waited", str),
    ("waited_latency_p99_ms", "waited p99 ms", ms),
    ("lag_p50_ms", "lag p50 ms", ms),
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
        cells += [_cell(str(row["context"]), "k"), _cell(marked(row["durable"], critical), "k")]
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
    items = "".join(f"<li>{html.escape(describe(f).strip())}</li>" for f in findings[:200])
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


def _waited_html(report: Report) -> str:
    rows = critical_first(waited_rows(report.totals), report.critical)
    if not rows:
        return ""
    body = "".join(
        f"<tr>{_cell(r['context'], 'k')}{_cell(marked(r['durable'], report.critical), 'k')}"
        f"{_cell(str(r['waited']))}{_cell(ms(r['waited_latency_p99_ms']))}"
        f"{_cell(ms(r['waited_latency_max_ms']))}</tr>"
        for r in rows
    )
    return (
        "<h2>Waited for an operator</h2><p>Processed after an operator's move: replayed "
        "after a dead letter, or released from behind a held head. Their latency is the "
        "operator's: it is not in the p50/p95/p99 columns (the pipeline's own) and is not "
        "judged.</p><table><tr><th>context</th><th>durable</th><th>events</th>"
        f"<th>p99 ms</th><th>max ms</th></tr>{body}</table>"
    )


def render_html(report: Report, latency_png: Path, windows_png: Path) -> str:
    """The standalone HTML report (plots embedded)."""
    high = report.critical
    per_window = [r for r in report.windows if r["subject"] == ALL_SUBJECTS]
    folded = len(per_window) > HTML_WINDOW_ROWS
    not_final = open_line(report)
    lost = "".join(
        f"<li>{html.escape(json.dumps(jsonable(item)))}</li>" for item in report.lost_listed[:100]
    )
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Ferry KPIs · "
        f"{html.escape(report.topology)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Ferry KPI report · {html.escape(report.topology)}</h1>",
        f'<p class="banner {html.escape(report.verdict)}">verdict: '
        f"{html.escape(report.verdict.upper())} (exit {report.exit_code})</p>",
        f"<p>{html.escape(range_text(report))} · {report.window_seconds}s windows · "
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
        "<p>Latency p50/p95/p99: the pipeline's own (events that waited for an operator "
        "apart, below). Parked, retrying and in flight: not final yet, never lost.</p>",
        f"<p>{html.escape(not_final)}</p>" if not_final else "",
        _waited_html(report),
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
        f"<h2>Lost ({report.lost_count})</h2><p>Published before the grace period and no "
        f"inbox row, dead letter or parked row accounts for them.</p><ul>{lost}</ul>"
        if report.lost_count
        else "",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)
