"""The first run a user makes: the README's run command (without its setup step) on a
fresh data directory, the demo with its defaults and the KPI job, as `./dev run` does.

It must end with nothing lost and no key parked (the demo plays the operator of the
ordered lanes to the end), every remaining dead letter one the demo injected on purpose,
and both topologies' KPI reports written, with no lost and no parked event in them
(issue 42: the first screen said "lost 10" where nothing was lost)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

#: A bound, not an expectation: the demo produces for 20 s, settles, then runs Spark.
RUN_LIMIT = 840.0


def _count(summary: str, label: str) -> int:
    found = re.search(rf"^  {re.escape(label)}\s+(\d+)", summary, re.MULTILINE)
    assert found, f"no {label!r} line in the summary:\n{summary}"
    return int(found.group(1))


@pytest.fixture
def var() -> Iterator[Path]:
    """A fresh data directory the stack's unprivileged PostgreSQL user can reach (pytest's
    own tmp_path is private to root when the tests run as root)."""
    base = Path(tempfile.mkdtemp(prefix="ferry-demo-"))
    base.chmod(0o755)
    try:
        yield base / "var"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(RUN_LIMIT + 60)
def test_the_first_run_ends_with_nothing_lost_and_every_key_released(var: Path) -> None:
    argv = [sys.executable, "-m", "devstack.stack", "up", "--demo", "--var-dir", str(var)]
    result = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT, check=False
    )
    out = result.stdout.replace("\r", "\n")
    tail = out[-6000:] + "\n--- stderr ---\n" + result.stderr[-3000:]
    assert "Ferry demo summary" in out, tail
    summary = out[out.index("Ferry demo summary") :]
    assert _count(summary, "lost") == 0, tail
    assert _count(summary, "parked") == 0, tail
    for label in ("retrying", "in flight", "not published"):
        assert _count(summary, label) == 0, tail
    assert _count(summary, "processed") > 0, tail
    # Every dead letter left is one the demo made on purpose (poison, bad schema).
    assert "NOT injected" not in summary, tail
    assert result.returncode == 0, tail
    for topology in ("sea-vibespro", "mediation"):
        reports = sorted((var / "kpi" / topology).glob("*/report.json"))
        assert reports, f"no KPI report for {topology}\n{tail}"
        doc = json.loads(reports[-1].read_text())
        assert doc["lost_candidates"]["count"] == 0, (topology, doc["lost_candidates"])
        totals = [r for r in doc["totals"] if r["subject"] == "*"]
        assert totals and all(r["lost_candidates"] == 0 for r in totals), totals
        assert all(r.get("parked", 0) == 0 for r in totals), totals
