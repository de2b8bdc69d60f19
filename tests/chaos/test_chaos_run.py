"""The CI chaos schedule, on every change: every role, real servers, real faults.

About 2,000 events (1 % poison, 0.5 % exhausting their deliveries, 5 % transiently
failing) over 60 s while publishers and consumers are SIGKILLed every 10±5 s (the first
of each inside its crash window), NATS is killed twice, PostgreSQL crashed once,
reset_peer hits every NATS link, and a handler link gets 5 s latency and a blackhole.
After the drain everything is counted against the intent ledger and the effects ledger.

The plan is fixed by the seed (``FERRY_CHAOS_SEED`` overrides it); a failure prints the
seed, the summary and the fault timeline, and ``python -m chaos.run --seed S`` runs the
same plan again by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.scenarios.fault_schedule.result import RunResult, render_timeline
from tests.chaos.conftest import recovery_gaps, run_as

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261121"))


async def test_ci_schedule_loses_nothing_and_applies_nothing_twice(tmp_path: Path) -> None:
    progress: list[str] = []
    config = RunConfig(schedule="ci", seed=SEED, run_dir=tmp_path / "run", echo=progress.append)
    result = await run_as(config, None, RunResult)
    story = (
        f"\nseed {SEED} (re-run: FERRY_CHAOS_SEED={SEED}, or python -m chaos.run --seed {SEED})"
        f"\n\n{result.summary}\n\nFault timeline\n{render_timeline(result.timeline)}"
        f"\n\nProgress\n" + "\n".join(progress)
    )

    # The schedule really happened: every fault the issue names, none failed to inject.
    assert [r for r in result.timeline.records if not r.ok] == [], story
    injected = result.timeline.by_kind()
    assert injected["kill_nats"] == 2 and injected["crash_postgres"] == 1, story
    for kind in ("nats_reset_peer", "handler_latency", "handler_blackhole"):
        assert injected[kind] == 1, story
    kills = {
        k: injected[k] + injected[f"{k}_in_window"] for k in ("kill_publisher", "kill_consumer")
    }
    assert min(kills.values()) >= 3, story  # every 10±5 s over 60 s
    windows = [r for r in result.timeline.records if r.kind.endswith("_in_window")]
    assert len(windows) == 2 and all(r.detail.startswith("in window") for r in windows), story

    # The workload was what the schedule asked for, every class represented.
    accounts = result.accounts
    assert accounts.committed >= 0.95 * result.schedule.events, story
    assert all(accounts.by_class[k] > 0 for k in ("poison", "exhausting", "transient")), story

    # The invariants: nothing lost, dead letters exact, once per stream, no double effect.
    assert result.drained, story
    assert result.violations == [], story
    assert (
        sum(d.processed for d in accounts.durables.values())
        + sum(sum(d.dead_letters.values()) for d in accounts.durables.values())
        == accounts.committed
    ), story
    # Roles ride faults out; none may die by itself.
    assert result.unexpected_exits == [], story
    # The recovery table: a figure for every fault kind injected, in the report too.
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert recovery_gaps(result.recovery, report["recovery"], injected) == [], story
    # Each fault carries its own figure too (overlapping faults can then be told apart),
    # and each kind's max is the largest of its faults'.
    for kind, line in result.recovery.items():
        mine = [f["recovery"] for f in report["faults"] if f["kind"] == kind and f["ok"]]
        worst = max((r for r in mine if r is not None), default=None)
        assert line.max == (None if worst is None else round(worst, 1)), story
