"""Smoke test of the bench's volume section (issue 48) at a tiny scale: it runs to the end
on empty tables and after seeding, and reports every figure with its counts.

No figure is judged (tiny sizes, a shared machine): the section's verdicts are for a
full run, by hand (``python -m bench --sections volume``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.sections.volume import FIGURES, LIMITS
from bench.volume_seed import Sizes

ROOT = Path(__file__).resolve().parents[2]
ROWS = 300
SCALE = 0.001

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench") / "out"
    argv = [
        sys.executable, "-m", "bench", "--sections", "volume", "--tracing", "off",
        "--volume-scale", str(SCALE), "--rows", str(ROWS), "--seconds", "2",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), done.stdout


def test_every_figure_is_reported_on_empty_tables_and_at_volume(
    run: tuple[dict[str, Any], str],
) -> None:
    doc, stdout = run
    assert doc["errors"] == []
    rows = {row["key"]: row for row in doc["table"]}
    for key in FIGURES:
        row = rows[f"volume.{key}"]
        assert row["values"]["off"] > 0 and row["baseline"] > 0, row
        assert row["verdict"] in ("met", "MISSED"), row
    for key in LIMITS:
        assert rows[f"volume.{key}_limit"]["verdict"] in ("met", "MISSED")
    assert "volume: empty against a year of history" in stdout


def test_the_counts_behind_the_figures(run: tuple[dict[str, Any], str]) -> None:
    doc, _ = run
    section = doc["sections"]["volume"]["off"]
    sizes = Sizes().scaled(SCALE)
    assert section["sizes"] == vars(sizes)
    for phase in ("empty", "volume"):
        figures = section[phase]
        assert figures["publisher"]["in_stream"] == ROWS, phase
        assert figures["consumer"]["processed"] == ROWS, phase
        assert figures["latency"]["unprocessed"] == 0, phase
    tables = section["volume"]["seeded"]["tables"]
    assert tables["inbox_messages"][0] == sizes.inbox
    assert tables["outbox_events"][0] == sizes.outbox + sizes.set_aside_behind + 1
    assert tables["dead_letters"][0] == sizes.dead_letters
    assert tables["parked_messages"][0] == sizes.parked
    assert tables["handler_applied"][0] == tables["handler_calls"][0] == sizes.claims
