"""The cluster scenarios: the pipeline on a 3-node JetStream cluster under node faults (issue 28).

``python -m chaos.run --scenario cluster [--schedule soak]`` runs every fault below in
turn; ``cluster-leader``, ``cluster-meta-leader``, ``cluster-partition`` and
``cluster-rolling`` run one kind alone (twice), ``cluster-ci`` (the CI test's) the leader
kill and the partition. The world (:mod:`chaos.scenarios.cluster.world`): three
nats-server nodes with JetStream (file store, ``sync_interval: always``), streams at 3
replicas, every route through a proxy of its own, every role on the seed list.

Faults, during the workload of the ordinary run (:mod:`chaos.engine.workload`):

``kill_stream_leader``  SIGKILL the node leading an event stream (``stream info``'s
                        ``cluster.leader``), restart it on its store 2 s later
``kill_meta_leader``    SIGKILL the meta leader (``/jsz``), restart it on its store
``partition``           one node (the stream leader) cut from the other two: its four
                        route proxies disabled, both directions; healed after a while
``rolling_restart``     each node in turn stopped (SIGTERM) and started, the next only
                        once the cluster is healthy again

Besides the ordinary invariants (:mod:`chaos.engine.accounting`: 0 lost, dead letters exactly
the expected set, each id once per stream, 0 effects twice), a **probe** publishes into
the event streams throughout (on a replay subject no durable reads) and records every
PubAck's (stream, sequence, message id): afterwards each acknowledged sequence must hold
its message (*acknowledged but missing*: 0); every outbox row the publisher marked
published (it does only on a PubAck) must be in its stream; and no role may need a restart
(the engine's monitor restarts and counts a role that died). Each fault's
**recovery time** is the longest any event waited on it (:mod:`chaos.engine.recovery`): from
the later of its commit and the fault — for a partition, the moment the routes are back —
to its processing, so a stalled lane counts, not only the first event through; the
results give it per fault and per kind (p50, max: :mod:`chaos.engine.recovery_table`).

The pieces live in sibling modules: :mod:`chaos.scenarios.cluster.world` (the cluster's
world), :mod:`chaos.scenarios.cluster.plan` (the scenarios, their sizes and each one's
fault plan), :mod:`chaos.scenarios.cluster.probe` (the probe) and
:mod:`chaos.scenarios.cluster.result` (the result, its invariants and the results table);
this module holds the run itself (:class:`ClusterRun`: the play, the faults, settling,
recovery times), handed an :class:`~chaos.engine.engine.Engine` on the cluster's world.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from chaos.engine.config import RunConfig, sized
from chaos.engine.engine import Engine, sleep_until
from chaos.engine.faults import FaultRecord
from chaos.engine.recovery_table import recovery_table
from chaos.engine.schedule import PlannedFault
from chaos.scenarios.cluster.plan import CLUSTER_SCENARIOS, SIZES, cluster_plan
from chaos.scenarios.cluster.probe import Probe
from chaos.scenarios.cluster.result import ClusterResult, FaultRow
from chaos.scenarios.cluster.world import ClusterWorld

#: Seconds a killed node stays down.
NODE_DOWN = 2.0
#: Seconds the cluster gets to be healthy again after a fault.
HEAL_TIMEOUT = 120.0


class ClusterRun:
    """One cluster scenario (see the module docstring)."""

    def __init__(self, config: RunConfig, scenario: str, size_name: str = "ci") -> None:
        if scenario not in CLUSTER_SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} ({', '.join(CLUSTER_SCENARIOS)})")
        self.config, self.scenario, self.size_name = config, scenario, size_name
        self.size = sized(SIZES[size_name], config)
        self.world = ClusterWorld(config.run_dir, config.seed)
        self.engine = Engine(config, self.world)
        self.records: list[FaultRecord] = []
        self.probe = Probe([], [])

    @property
    def streams(self) -> list[str]:
        """The event streams, in a stable order."""
        topo = self.world.topo
        return sorted(s.stream.name for s in topo.contexts.values() if s.stream is not None)

    async def run(self) -> ClusterResult:
        """Start, play, settle, drain, count; always tear the world down."""
        started = time.monotonic()
        engine = self.engine
        async with engine.session(
            f"scenario {self.scenario} ({self.size_name}), seed {self.config.seed}"
        ):
            nc = await engine.connect(self.world.nodes().urls, "chaos-cluster")
            await engine.roles_ready()
            self.probe = Probe(self.world.nodes().urls, self.streams)
            await engine.play(
                engine.workload(self.size.events, self.size.seconds),
                self.size.seconds,
                self._faults,
                progress=self._progress_line,
                beside=[self.probe.run],
            )
            await self._settle()
            drain = await engine.drain(self.size.drain_timeout)
            acked_missing = await self.probe.missing(nc.jetstream())
            await self.probe.purge(nc.jetstream())
            accounts = await engine.count()
            recoveries, baseline = await engine.recoveries(self.records)
        origin = engine.timeline.origin
        return ClusterResult(
            name=self.scenario,
            size=self.size_name,
            seed=self.config.seed,
            accounts=accounts,
            faults=[
                FaultRow(r.kind, r.started - origin, r.target, r.detail, r.ok, rec)
                for r, rec in zip(self.records, recoveries, strict=True)
            ],
            probe_sent=self.probe.sent,
            probe_acked=len(self.probe.acked),
            probe_unacked=dict(self.probe.unacked),
            acked_missing=acked_missing,
            outbox_acked_missing=[
                i
                for c in accounts.contexts.values()
                for i in c.missing_from_stream
                if i not in set(c.unpublished)
            ],
            baseline_latency=baseline,
            recovery=recovery_table(self.records, recoveries),
            **engine.outcome(started, drain),
        )

    # -- the play -------------------------------------------------------------------------

    async def _faults(self, begin: float) -> None:
        for planned in cluster_plan(self.scenario, self.size):
            await sleep_until(begin + planned.at)
            await self._inject_one(planned)

    def _progress_line(self, elapsed: float, counts: str) -> str:
        committed = self.engine.ledger.count("committed")
        return (
            f"t+{elapsed:5.0f}s  committed {committed}  {counts}"
            f"  probe acks {len(self.probe.acked)}"
        )

    async def _inject_one(self, planned: PlannedFault) -> None:
        actions: dict[str, Callable[[FaultRecord, PlannedFault], Awaitable[None]]] = {
            "kill_stream_leader": self._kill_stream_leader,
            "kill_meta_leader": self._kill_meta_leader,
            "partition": self._partition,
            "rolling_restart": self._rolling_restart,
        }
        record = FaultRecord(planned.kind, "", planned.at, time.time(), affects=frozenset({"*"}))
        await self.engine.record_fault(record, actions[planned.kind](record, planned), self.records)

    async def _stream_leader(self, stream: str) -> str:
        """The server name leading ``stream`` (retried through an election)."""
        assert self.engine.nc is not None
        js = self.engine.nc.jetstream(timeout=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader:
                    return info.cluster.leader
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stream} has no leader")
            await asyncio.sleep(0.2)

    async def _heal(self, record: FaultRecord, since: float) -> None:
        """Wait until every node is up, agrees on a meta leader and is current."""
        await asyncio.to_thread(self.world.nodes().wait_ready, HEAL_TIMEOUT)
        record.detail += f"; cluster healthy {time.time() - since:.1f}s after"

    async def _kill_and_restart(self, record: FaultRecord, index: int) -> None:
        cluster = self.world.nodes()
        await asyncio.to_thread(cluster.kill_node, index)
        record.started = time.time()
        await asyncio.sleep(NODE_DOWN)
        await asyncio.to_thread(cluster.start_node, index, wait=False)
        record.detail += f"; restarted on its store after {NODE_DOWN:.0f}s"
        await self._heal(record, record.started)

    async def _kill_stream_leader(self, record: FaultRecord, planned: PlannedFault) -> None:
        stream = self.streams[int(planned.target or 0) % len(self.streams)]
        leader = await self._stream_leader(stream)
        record.target = leader
        record.detail = f"{stream} leader {leader} SIGKILLed"
        await self._kill_and_restart(record, self.world.nodes().index_of(leader))
        record.detail += f"; {stream} now led by {await self._stream_leader(stream)}"

    async def _kill_meta_leader(self, record: FaultRecord, planned: PlannedFault) -> None:
        cluster = self.world.nodes()
        leader = await asyncio.to_thread(cluster.meta_leader)
        if leader is None:
            raise RuntimeError("no meta leader to kill")
        record.target = leader
        record.detail = f"meta leader {leader} SIGKILLed"
        await self._kill_and_restart(record, cluster.index_of(leader))
        record.detail += f"; meta leader now {await asyncio.to_thread(cluster.meta_leader)}"

    async def _partition(self, record: FaultRecord, planned: PlannedFault) -> None:
        stream = self.streams[int(planned.target or 0) % len(self.streams)]
        leader = await self._stream_leader(stream)
        index = self.world.nodes().index_of(leader)
        record.target = leader
        names = self.world.route_links_of(index)
        proxies = [await asyncio.to_thread(self.world.client.get_proxy, n) for n in names]
        try:
            for proxy in proxies:
                await asyncio.to_thread(proxy.disable)
            record.started = time.time()
            await asyncio.sleep(1.0)
            moved = await self._majority_leader(stream, index, planned.duration - 2.0)
            rest = record.started + planned.duration - time.time()
            if rest > 0:
                await asyncio.sleep(rest)
        finally:
            for proxy in proxies:
                await asyncio.to_thread(proxy.enable)
            record.restored = time.time()
        record.detail = (
            f"{leader} ({stream} leader) cut from the others for {planned.duration:.0f}s"
            f" ({len(names)} route proxies); the majority's {stream} leader: {moved}"
        )
        await self._heal(record, time.time())

    async def _majority_leader(self, stream: str, cut: int, timeout: float) -> str:
        """Who leads ``stream`` for the nodes not cut off, once they agree on a new one."""
        cluster = self.world.nodes()
        others = [i for i in range(cluster.size) if i != cut]
        deadline = time.monotonic() + max(timeout, 1.0)
        seen: set[str] = set()
        while time.monotonic() < deadline:
            seen = {
                (await asyncio.to_thread(cluster.stream_leaders, i)).get(stream, "") for i in others
            }
            if len(seen) == 1 and "" not in seen and cluster.node_name(cut) not in seen:
                return seen.pop()
            await asyncio.sleep(0.3)
        return f"not agreed ({', '.join(sorted(s or 'none' for s in seen))})"

    async def _rolling_restart(self, record: FaultRecord, planned: PlannedFault) -> None:
        cluster = self.world.nodes()
        record.target = "every node"
        record.started = time.time()
        steps = []
        for index in range(cluster.size):
            begin = time.time()
            await asyncio.to_thread(cluster.nodes[index].stop)
            await asyncio.to_thread(cluster.start_node, index, wait=False)
            await asyncio.to_thread(cluster.wait_ready, HEAL_TIMEOUT)
            steps.append(f"{cluster.node_name(index)} {time.time() - begin:.1f}s")
        record.detail = "stopped, started, healthy: " + ", ".join(steps)

    # -- after the play ---------------------------------------------------------------------

    async def _settle(self) -> None:
        """No toxic left, every proxy enabled, every node and role running."""
        await asyncio.to_thread(self.world.client.reset)
        cluster = self.world.nodes()
        for index, node in enumerate(cluster.nodes):
            if not node.running:
                self.engine.timeline.note(f"{cluster.node_name(index)} was down after the faults")
                await asyncio.to_thread(cluster.start_node, index, wait=False)
        await asyncio.to_thread(cluster.wait_ready, HEAL_TIMEOUT)
        self.engine.start_roles()
