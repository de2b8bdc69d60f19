"""The reports of one run: JSON (machines), text (the terminal), HTML with PNG plots (people).

Written to ``FERRY_KPI_REPORT_DIR/<topology>/<run>/`` (``report.json``, ``report.html``,
``summary.txt``, ``latency.png``, ``windows.png``), with ``<topology>/latest`` pointing at
the newest run. The plots are drawn on matplotlib's Agg canvas directly (no pyplot, no
global state, no display needed).

This module writes a run's files (and keeps ``latest`` and the retention) and shapes Spark's
latency histogram for the report; the pieces live beside it: ``report_model`` (the ``Report``
record and its JSON), ``report_text`` (the terminal summary), ``report_plots`` (the PNG
plots) and ``report_html`` (the HTML page).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from spark.report_html import render_html as render_html
from spark.report_model import Report as Report
from spark.report_plots import plot_latency, plot_windows
from spark.report_text import critical_first as critical_first
from spark.report_text import text_summary as text_summary
from spark.transforms import HIST_BINS_PER_DECADE


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
