"""The handler outage (issue 45) at CI size, breaker on: the lane's handler down for 20 s while
events keep arriving at 10/s, the durable on its shipped clocks.

Counts only (the resume and drain times are the scenario's verdict, not this test's: a busy
CI machine must not fail it): nothing lost, nothing applied twice, no dead letter, no event
past its 2nd delivery but by the probes, the breaker opened and closed again.
``python -m chaos.run --scenario handler-outage --seed S`` runs it by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.scenarios.handler_outage.result import OutageResult
from tests.chaos.conftest import run_as

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261129"))


async def test_breaker_holds_the_lane_through_a_handler_outage(tmp_path: Path) -> None:
    progress: list[str] = []
    config = RunConfig(seed=SEED, run_dir=tmp_path / "run", echo=progress.append)
    result = await run_as(config, "handler-outage", OutageResult)
    story = (
        f"\nseed {SEED} (re-run: python -m chaos.run --scenario handler-outage --seed {SEED})"
        f"\n\n{result.render()}\n\nProgress\n" + "\n".join(progress)
    )
    f = result.figures
    assert f is not None, story
    assert result.violations == [], story
    assert result.drained and result.outage_ok, story
    assert f.events >= 0.95 * 400 and f.committed_during_outage > 0, story
    assert (f.lost, f.applied_twice, f.dead_letters) == (0, 0, 0), story
    assert f.past_second_without_probes == 0, story
    assert f.backlog > 0 and f.backlog_unapplied == 0, story
    assert f.breaker_opened >= 1 and f.breaker_closed >= 1 and f.probes >= 1, story
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["figures"]["lost"] == 0 and report["breaker"] == "on", story
