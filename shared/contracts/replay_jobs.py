"""Where a topology runs the replay API's async mode (INFRA-005 §1.4, issue 26).

A replay job travels as the event :data:`REPLAY_JOB_EVENT` v:data:`REPLAY_JOB_VERSION`:
the context that publishes it hosts the replay lane (mediation: ``module_g``, whose stream
is ``mediation.replay.jobs``), and the handler of the context whose durable handles it
(``cg_replay``, also module_g) executes the jobs. A topology without the event has no
replay API; the console says so instead of accepting jobs nobody would run.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.contracts.topology import Topology

#: The event that carries one replay job (manifests/mediation/module_g.yaml).
REPLAY_JOB_EVENT = "replay_job_requested"
REPLAY_JOB_VERSION = 1


@dataclass(frozen=True)
class ReplayLane:
    """The replay lane of a topology: who records jobs, who runs them, and where."""

    #: The context that publishes jobs (its database holds ``replay_jobs`` and the outbox).
    context: str
    database: str
    #: The contexts whose handlers execute jobs (targets of the durables handling it).
    workers: tuple[str, ...]


def replay_lane(topology: Topology) -> ReplayLane | None:
    """The topology's replay lane, or None when no context publishes replay jobs."""
    for event in topology.events:
        if (event.type, event.version) != (REPLAY_JOB_EVENT, REPLAY_JOB_VERSION):
            continue
        if event.context not in topology.contexts:
            continue
        workers = sorted({topology.durables[d].target for d in event.handled_by})
        return ReplayLane(event.context, topology.contexts[event.context].database, tuple(workers))
    return None


def replay_workers(topology: Topology) -> tuple[str, ...]:
    """Contexts whose handler executes replay jobs (they need NATS and replay grants)."""
    lane = replay_lane(topology)
    return () if lane is None else lane.workers
