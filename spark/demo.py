"""The demo's last act: the KPI job over what the demo just did, and its report.

``devstack.demo`` calls :func:`show_kpi_report` once its own reckoning is printed. The
job runs as the operator would run it (``python -m spark.kpi_job``), over an explicit
range from the demo's start to now, in 10-second windows so a short demo still has a
trend to plot; explicit ranges never move the hourly watermark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from spark.errors import EXIT_SLO_BREACH, MEANINGS

ROOT = Path(__file__).resolve().parents[1]
#: Window and grace of the demo's run: short, because the demo is.
DEMO_WINDOW, DEMO_GRACE = "10s", "10s"
QUICK_JVM = "-Duser.timezone=UTC -XX:TieredStopAtLevel=1"
#: The p99 latency (ms) the demo's own one-off failures explain: 3 % of its events are
#: retried once after their durable's first back-off (1 s), so a window's p99 is one of
#: them; a p99 above this is not the demo's doing.
RETRIED_P99_MS = 2500.0


def show_kpi_report(env: dict[str, str], *, since: datetime, topologies: Sequence[str]) -> int:
    """Run the job over ``[since, now]`` for ``topologies``; print its summary; return its code."""
    var = Path(env.get("FERRY_VAR") or ROOT / ".var")
    log = var / "log" / "kpi-demo.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "spark.kpi_job", "--since", since.isoformat(), "--until", "now",
            "--window", DEMO_WINDOW, "--grace", DEMO_GRACE]  # fmt: skip
    for topology in topologies:
        argv += ["--topology", topology]
    child_env = {
        "FERRY_KPI_REPORT_DIR": str(var / "kpi"),
        # A one-off run on a little data: the JVM's quick compiler only starts faster.
        "FERRY_KPI_SPARK_CONF": json.dumps({"spark.driver.extraJavaOptions": QUICK_JVM}),
        **env,
    }
    print("\nkpi-spark-job: reconciling every context database on Spark (about half a minute) ...")
    with log.open("w") as spark_log:
        result = subprocess.run(
            argv, env=child_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=spark_log, text=True,
            timeout=900, check=False,
        )  # fmt: skip
    print(result.stdout.rstrip())
    meaning = MEANINGS.get(result.returncode, "unexpected exit")
    print(f"\nkpi-spark-job exit {result.returncode}: {meaning} (Spark's log: {log})")
    pages = [
        Path(line.removeprefix("report: "))
        for line in result.stdout.splitlines()
        if line.startswith("report: ")
    ]
    if result.returncode == EXIT_SLO_BREACH:
        print(
            "  The demo injects poison and temporarily rejected events on purpose, so the "
            "dead-letter\n  rate target (< 0.1 %) is expected to be missed. Events parked "
            "behind a held dead letter\n  count as parked, never as lost; events processed "
            "after a replay of their dead letter\n  (or released from behind a held head) "
            "have their latency apart from the pipeline's own.\n  The demo also makes 3 % "
            "of the events fail once (503): each waits its durable's first\n  back-off "
            f"(1 s) before its retry, so a p99 up to {RETRIED_P99_MS / 1000:.1f} s is those "
            "retries, by design."
        )
        others = unexpected_misses(pages)
        if others:
            print(f"  Also missed, and not by design: {', '.join(others)} (findings above).")
        elif others is not None:
            print("  Every other target was met: nothing lost, nothing parked.")
    for page in pages:
        print(f"  open {page} for the tables and plots")
    return result.returncode


def unexpected_misses(pages: Sequence[Path]) -> list[str] | None:
    """The gating targets the reports beside ``pages`` missed other than those the demo
    misses on purpose (the dead-letter rate; a p99 latency its one-off failures' retries
    explain); None when a report cannot be read."""
    names: set[str] = set()
    for page in pages:
        try:
            doc = json.loads(page.with_name("report.json").read_text())
        except (OSError, ValueError):
            return None
        for finding in doc.get("findings", {}).get("gate", []):
            retried = finding["name"] == "latency" and finding["value"] <= RETRIED_P99_MS
            if finding["name"] != "dlq" and not retried:
                names.add(finding["name"])
    return sorted(names) if pages else None
