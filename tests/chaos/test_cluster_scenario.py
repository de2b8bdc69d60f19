"""The cluster scenario (issue 28) at CI size: the pipeline on a 3-node JetStream cluster.

The run (:mod:`chaos.scenarios.cluster.run`, plan ``cluster-ci``): streams at 3 replicas on three
nats-server nodes whose routes go through proxies, every role on the seed list, the
workload of the ordinary run; meanwhile the node leading SEA_EVENTS is SIGKILLed and
restarted on its store, then the (new) leader is cut from the other two nodes, both
directions, and healed. Afterwards: 0 lost, 0 effects twice, dead letters exactly the
expected set, each id once per stream; every publish JetStream acknowledged still in the
stream at its sequence (the probe's and the publisher's); no role restarted. ``python -m
chaos.run --scenario cluster --seed S`` runs all four faults by hand (``--schedule soak``
for the long version).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.engine.config import RunConfig
from chaos.registry import SCENARIOS
from chaos.scenarios.cluster.plan import CLUSTER_SCENARIOS, SIZES, ClusterSize, cluster_plan
from chaos.scenarios.cluster.result import ClusterResult
from tests.chaos.conftest import recovery_gaps, run_as

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261126"))


def test_every_plan_spreads_its_faults_inside_the_fault_phase() -> None:
    for name, kinds in CLUSTER_SCENARIOS.items():
        for size in (*SIZES.values(), ClusterSize(120.0, 100, 60.0, rounds=3)):
            plan = cluster_plan(name, size)
            assert {f.kind for f in plan} == set(kinds), name
            assert len(plan) == size.rounds * max(len(kinds), 2), name
            assert [f.at for f in plan] == sorted(f.at for f in plan), name
            assert all(0 < f.at < size.seconds for f in plan), name
            ends = [f.at + f.duration for f in plan]
            assert max(ends) < size.seconds, name
            assert all(f.duration > 0 for f in plan if f.kind == "partition"), name


@pytest.mark.integration
async def test_leader_kill_and_partition_lose_no_acknowledged_publish(tmp_path: Path) -> None:
    progress: list[str] = []
    config = RunConfig(
        seed=SEED, run_dir=tmp_path / "run", seconds=40.0, events=300, echo=progress.append
    )
    result = await run_as(config, "cluster-ci", ClusterResult)
    story = (
        f"\nseed {SEED} (re-run: python -m chaos.run --scenario cluster-ci --seed {SEED})\n\n"
        + result.render()
        + "\n\nProgress\n"
        + "\n".join(progress)
    )
    table = json.loads((tmp_path / "run" / "cluster.json").read_text())

    # Both faults happened, as planned.
    assert table["faults injected"] == {"kill_stream_leader": 1, "partition": 1}, story
    kill, partition = result.faults
    assert kill.kind == "kill_stream_leader" and "SIGKILLed" in kill.detail, story
    assert partition.kind == "partition" and "cut from the others" in partition.detail, story
    # The invariants of every run, and the cluster's own.
    assert result.drained, story
    assert result.accounts.violations == [], story
    assert table["lost"] == 0 and table["effects applied twice"] == 0, story
    assert table["dead letters (found)"] == table["dead letters (expected)"], story
    assert result.probe_acked > 100, story
    assert result.acked_missing == [] and result.outbox_acked_missing == [], story
    assert result.role_restarts == 0 and result.unexpected_exits == [], story
    assert result.accounts.committed >= 0.95 * 300, story
    # The pipeline came back after each fault.
    assert all(f.recovery is not None for f in result.faults), story
    injected = ("kill_stream_leader", "partition")
    assert recovery_gaps(result.recovery, table["recovery"], injected) == [], story
    assert result.violations == [], story


def test_chaos_run_offers_every_cluster_scenario() -> None:
    assert set(CLUSTER_SCENARIOS) <= set(SCENARIOS)
