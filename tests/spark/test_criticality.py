"""The KPI report lists the ``criticality: high`` lanes first and marks them (INFRA-005 §7).

Pure: the report's writers on hand-made rows (no Spark, no database); the plan reads the
critical durables from the shipped mediation topology.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from shared.contracts.loading import load_topology
from spark.kpis import Row, empty_counts, with_rates
from spark.plan import ALL_SUBJECTS, Plan
from spark.report import Report, critical_first, render_html, text_summary
from spark.verdicts import AlertRules, Finding, Targets

ROOT = Path(__file__).resolve().parents[2]
AS_OF = datetime(2026, 11, 26, 12, tzinfo=UTC)


def row(context: str, durable: str) -> Row:
    counts = {**empty_counts(), "produced": 10, "published": 10, "processed": 10}
    return with_rates(
        {
            **counts,
            "context": context,
            "durable": durable,
            "subject": ALL_SUBJECTS,
            "window_start": AS_OF,
            "slo_breaches": [],
            "alerts": [],
        }
    )


def finding(durable: str) -> Finding:
    return Finding("alert", "lag", "window", AS_OF, "module_x", durable, ALL_SUBJECTS, 1.0, 0.5)


def report(critical: list[str]) -> Report:
    totals = [row("module_e", "cg_f_ingest"), row("module_f", "cg_g_archive"),
              row("module_h", "cg_h_publish"), row("module_g", "cg_replay")]  # fmt: skip
    return Report(
        run_id="r1", topology="mediation", as_of=AS_OF, start=AS_OF, end=AS_OF,
        incremental=True, window_seconds=60, grace_seconds=0.0, kpi_database="kpi",
        gate="total", targets=Targets(), rules=AlertRules(), exit_code=0, verdict="pass",
        totals=totals, windows=totals, alerts=[finding("cg_f_ingest"), finding("cg_h_publish")],
        critical=critical,
    )  # fmt: skip


def test_the_plan_knows_the_critical_durables() -> None:
    plan = Plan(load_topology(ROOT / "topologies/mediation.yaml"))
    assert plan.critical_durables() == ["cg_h_publish"]
    assert Plan(load_topology(ROOT / "topologies/sea-vibespro.yaml")).critical_durables() == []


def test_critical_rows_come_first_and_the_rest_keep_their_order() -> None:
    rows = report([]).totals
    ordered = [r["durable"] for r in critical_first(rows, ["cg_h_publish"])]
    assert ordered == ["cg_h_publish", "cg_f_ingest", "cg_g_archive", "cg_replay"]
    assert [r["durable"] for r in critical_first(rows, [])] == [r["durable"] for r in rows]


def test_the_text_summary_lists_and_marks_the_critical_lane_first() -> None:
    text = text_summary(report(["cg_h_publish"]), None)
    lines = [line for line in text.splitlines() if line.startswith("module_")]
    assert lines[0].split()[:3] == ["module_h", "cg_h_publish", "[high]"]
    assert [line.split()[1] for line in lines[1:]] == ["cg_f_ingest", "cg_g_archive", "cg_replay"]
    alerts = [line for line in text.splitlines() if "lag = " in line]
    assert "cg_h_publish" in alerts[0] and "cg_f_ingest" in alerts[1]
    plain = text_summary(report([]), None)
    assert "[high]" not in plain
    assert next(ln.split()[1] for ln in plain.splitlines() if ln.startswith("module_")) == (
        "cg_f_ingest"
    )


def test_the_html_report_lists_and_marks_the_critical_lane_first(tmp_path: Path) -> None:
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG")
    page = render_html(report(["cg_h_publish"]), png, png)
    totals = page.split("<h2>Run totals</h2>", 1)[1].split("</table>", 1)[0]
    assert totals.index("cg_h_publish [high]") < totals.index("cg_f_ingest")
    assert '<tr class=" high">' in totals
    assert "Critical lanes (criticality: high) first" in page
    assert report(["cg_h_publish"]).to_json()["critical_durables"] == ["cg_h_publish"]
