"""The first run a user makes: the README's run command (without its setup step) on a
fresh data directory, the demo with its defaults and the KPI job, as `./dev run` does.

It must end with nothing lost and no key parked (the demo plays the operator of the
ordered lanes to the end), every remaining dead letter one the demo injected on purpose,
and both topologies' KPI reports written, with no lost and no parked event in them
(issue 42: the first screen said "lost 10" where nothing was lost)."""

from __future__ import annotations

import json
import re

import pytest

from tests.first_run import DemoRun

pytestmark = pytest.mark.integration


def _count(summary: str, label: str) -> int:
    found = re.search(rf"^  {re.escape(label)}\s+(\d+)", summary, re.MULTILINE)
    assert found, f"no {label!r} line in the summary:\n{summary}"
    return int(found.group(1))


def test_the_first_run_ends_with_nothing_lost_and_every_key_released(first_run: DemoRun) -> None:
    var = first_run.var
    out = first_run.stdout.replace("\r", "\n")
    tail = out[-9000:]
    assert "Ferry demo summary" in out, tail
    summary = out[out.index("Ferry demo summary") :]
    assert _count(summary, "lost") == 0, tail
    assert _count(summary, "parked") == 0, tail
    for label in ("retrying", "in flight", "not published"):
        assert _count(summary, label) == 0, tail
    assert _count(summary, "processed") > 0, tail
    # Every dead letter left is one the demo made on purpose (poison, bad schema).
    assert "NOT injected" not in summary, tail
    assert first_run.returncode == 0, tail
    for topology in ("sea-vibespro", "mediation"):
        reports = sorted((var / "kpi" / topology).glob("*/report.json"))
        assert reports, f"no KPI report for {topology}\n{tail}"
        doc = json.loads(reports[-1].read_text())
        assert doc["lost_candidates"]["count"] == 0, (topology, doc["lost_candidates"])
        totals = [r for r in doc["totals"] if r["subject"] == "*"]
        assert totals and all(r["lost_candidates"] == 0 for r in totals), totals
        assert all(r.get("parked", 0) == 0 for r in totals), totals
