"""The cluster scenarios' plans: which fault kinds each ``--scenario`` plays, how big a run is
(:class:`ClusterSize`, :data:`SIZES`) and when each fault comes (:func:`cluster_plan`)."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.engine.config import Size
from chaos.engine.schedule import PlannedFault

#: The ``--scenario`` names and the fault kinds each plays.
CLUSTER_SCENARIOS: dict[str, tuple[str, ...]] = {
    # The partition last: the cluster may take long to be healthy after it heals (the cut
    # node's higher Raft term forces re-elections), and the next fault waits for that.
    "cluster": ("kill_stream_leader", "kill_meta_leader", "rolling_restart", "partition"),
    "cluster-leader": ("kill_stream_leader",),
    "cluster-meta-leader": ("kill_meta_leader",),
    "cluster-partition": ("partition",),
    "cluster-rolling": ("rolling_restart",),
    # The CI test's: the two the issue asks of CI, in well under three minutes.
    "cluster-ci": ("kill_stream_leader", "partition"),
}
#: What each fault kind does (docs/explanation/chaos.md repeats this).
CLUSTER_FAULT_KINDS: dict[str, str] = {
    "kill_stream_leader": "SIGKILL the node leading an event stream, restart it on its store",
    "kill_meta_leader": "SIGKILL the meta leader, restart it on its store",
    "partition": "cut one node from the other two (its route proxies, both directions), heal",
    "rolling_restart": "stop and start each node in turn, waiting for a healthy cluster",
}


@dataclass(frozen=True)
class ClusterSize(Size):
    """How big a cluster scenario runs (``rounds``: how often the plan repeats), and how long
    a partition lasts."""

    partition_seconds: float = 8.0


SIZES: dict[str, ClusterSize] = {
    "ci": ClusterSize(60.0, 500, 150.0),
    "soak": ClusterSize(600.0, 12_000, 400.0, rounds=5, partition_seconds=20.0),
}


def cluster_plan(scenario: str, size: ClusterSize) -> list[PlannedFault]:
    """The faults of a scenario: its kinds spread evenly over each round, rounds back to back
    (a kind alone gets two goes per round, the second on the other stream)."""
    kinds = list(CLUSTER_SCENARIOS[scenario])
    if len(kinds) == 1:
        kinds = kinds * 2
    round_seconds = size.seconds / size.rounds
    slot = round_seconds / (len(kinds) + 0.5)
    faults = []
    for r in range(size.rounds):
        for k, kind in enumerate(kinds):
            duration = size.partition_seconds if kind == "partition" else 0.0
            at = r * round_seconds + (k + 0.35) * slot
            target = str(k % 2)  # which event stream (by index) the fault is aimed at
            faults.append(PlannedFault(round(at, 1), kind, target, duration))
    return faults
