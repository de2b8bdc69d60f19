"""The cluster scenarios: the pipeline on a 3-node JetStream cluster under node faults (issue 28).

``python -m chaos.run --scenario cluster [--schedule soak]`` runs every fault below in
turn; ``cluster-leader``, ``cluster-meta-leader``, ``cluster-partition`` and
``cluster-rolling`` run one kind alone (twice), ``cluster-ci`` (the CI test's) the leader
kill and the partition. The world (:mod:`chaos.cluster_world`): three
nats-server nodes with JetStream (file store, ``sync_interval: always``), streams at 3
replicas, every route through a proxy of its own, every role on the seed list.

Faults, during the workload of the ordinary run (:mod:`chaos.workload`):

``kill_stream_leader``  SIGKILL the node leading an event stream (``stream info``'s
                        ``cluster.leader``), restart it on its store 2 s later
``kill_meta_leader``    SIGKILL the meta leader (``/jsz``), restart it on its store
``partition``           one node (the stream leader) cut from the other two: its four
                        route proxies disabled, both directions; healed after a while
``rolling_restart``     each node in turn stopped (SIGTERM) and started, the next only
                        once the cluster is healthy again

Besides the ordinary invariants (:mod:`chaos.accounting`: 0 lost, dead letters exactly
the expected set, each id once per stream, 0 effects twice), a **probe** publishes into
the event streams throughout (on a replay subject no durable reads) and records every
PubAck's (stream, sequence, message id): afterwards each acknowledged sequence must hold
its message (*acknowledged but missing*: 0); every outbox row the publisher marked
published (it does only on a PubAck) must be in its stream; and no role may need a restart
(:meth:`chaos.run_engine.Chaos._monitor` restarts and counts a role that died). Each fault's
**recovery time** is the time from the fault to the first event committed after it being
processed, in the slowest direction.

The pieces live in sibling modules: :mod:`chaos.scenario_cluster_plan` (the scenarios,
their sizes and each one's fault plan), :mod:`chaos.scenario_cluster_probe` (the probe) and
:mod:`chaos.scenario_cluster_result` (the result, its invariants and the results table);
this module holds the run itself (:class:`ClusterRun`: the play, the faults, settling,
recovery times) and the command, and re-exports them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable

from chaos.cluster_world import ClusterWorld
from chaos.faults import FaultRecord
from chaos.recovery import processed_times, recovery_times
from chaos.run import Chaos, RunConfig
from chaos.scenario_cluster_plan import CLUSTER_FAULT_KINDS as CLUSTER_FAULT_KINDS
from chaos.scenario_cluster_plan import CLUSTER_SCENARIOS as CLUSTER_SCENARIOS
from chaos.scenario_cluster_plan import SIZES as SIZES
from chaos.scenario_cluster_plan import ClusterSize as ClusterSize
from chaos.scenario_cluster_plan import cluster_plan as cluster_plan
from chaos.scenario_cluster_probe import PROBE_DURABLE as PROBE_DURABLE
from chaos.scenario_cluster_probe import PROBE_EVERY as PROBE_EVERY
from chaos.scenario_cluster_probe import Probe as Probe
from chaos.scenario_cluster_result import ClusterResult as ClusterResult
from chaos.scenario_cluster_result import FaultRow as FaultRow
from chaos.scenario_cluster_result import render_cluster_table as render_cluster_table
from chaos.schedule import PlannedFault, Schedule
from chaos.workload import Producer, plan_events
from shared.adapters.nats import connect_nats

log = logging.getLogger("chaos.cluster")

#: Seconds a killed node stays down.
NODE_DOWN = 2.0
#: Seconds the cluster gets to be healthy again after a fault.
HEAL_TIMEOUT = 120.0


class ClusterRun(Chaos):
    """One cluster scenario (see the module docstring)."""

    def __init__(self, config: RunConfig, scenario: str, size_name: str = "ci") -> None:
        super().__init__(config)
        if scenario not in CLUSTER_SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} ({', '.join(CLUSTER_SCENARIOS)})")
        self.scenario, self.size_name = scenario, size_name
        base = SIZES[size_name]
        self.size = ClusterSize(
            seconds=config.seconds or base.seconds,
            events=config.events or base.events,
            drain_timeout=config.drain_timeout or base.drain_timeout,
            rounds=base.rounds,
            partition_seconds=base.partition_seconds,
        )
        self.world: ClusterWorld = ClusterWorld(config.run_dir, config.seed)
        self.records: list[FaultRecord] = []
        self.probe: Probe | None = None

    @property
    def streams(self) -> list[str]:
        """The event streams, in a stable order."""
        topo = self.world.topo
        return sorted(s.stream.name for s in topo.contexts.values() if s.stream is not None)

    async def run_cluster(self) -> ClusterResult:
        """Start, play, settle, drain, count; always tear the world down."""
        started = time.monotonic()
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self.echo(f"scenario {self.scenario} ({self.size_name}), seed {self.config.seed}")
        try:
            await self.world.start()
        except BaseException:
            await self.world.stop()
            raise
        monitor = asyncio.create_task(self._monitor())
        try:
            self.nc = await connect_nats(
                self.world.nodes().urls, name="chaos-cluster", give_up_after=30
            )
            await self._roles_ready()
            await self._play()
            await self._settle_world()
            schedule = Schedule(
                self.scenario,
                self.config.seed,
                self.size.seconds,
                self.size.events,
                (),
                drain_timeout=self.size.drain_timeout,
            )
            drain = await self._drain(schedule)
            assert self.probe is not None and self.nc is not None
            js = self.nc.jetstream()
            acked_missing = await self.probe.missing(js)
            await self.probe.purge(js)
            accounts = await self._count()
            recoveries, baseline = await self._recoveries()
        finally:
            self.stopping.set()
            await asyncio.gather(monitor, return_exceptions=True)
            if self.nc is not None:
                await self.nc.close()
            await self.world.stop()
        origin = self.timeline.origin
        result = ClusterResult(
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
            restarts={r.name: r.starts - 1 for r in self.world.roles.values()},
            unexpected_exits=[
                f"{e.role} exited with {e.code} at t+{e.at - origin:.1f}s"
                for r in self.world.roles.values()
                for e in r.unexpected
            ],
            drained=drain is not None,
            drain_seconds=drain,
            duration=time.monotonic() - started,
            run_dir=self.config.run_dir,
            notes=[t for _, t in self.timeline.events],
            baseline_latency=baseline,
        )
        out = self.config.run_dir
        (out / "cluster.json").write_text(json.dumps(result.table(), indent=2, default=str) + "\n")
        (out / "cluster.txt").write_text(render_cluster_table(result) + "\n")
        return result

    # -- the play -------------------------------------------------------------------------

    async def _play(self) -> None:
        begin = time.monotonic()
        self.timeline.origin = time.time()
        stop = asyncio.Event()
        intents = plan_events(
            self.world.topo, self.config.seed, self.size.events, self.size.seconds
        )
        contexts = sorted({i.context for i in intents})
        self.producers = [
            Producer(c, self.world.direct_dsn(c), intents, self.ledger) for c in contexts
        ]
        self.probe = Probe(self.world.nodes().urls, self.streams)
        tasks = [asyncio.create_task(p.run(begin, stop)) for p in self.producers]
        probing = asyncio.create_task(self.probe.run(stop))
        progress = asyncio.create_task(self._progress_lines(begin))
        try:
            for planned in cluster_plan(self.scenario, self.size):
                delay = begin + planned.at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._inject_one(planned)
            rest = begin + self.size.seconds - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
            _, late = await asyncio.wait(tasks, timeout=30)
            if late:
                self.timeline.note(f"{len(late)} producer(s) late; stopped")
            stop.set()
            await asyncio.gather(*tasks, probing)
        finally:
            stop.set()
            progress.cancel()
            await asyncio.gather(progress, probing, return_exceptions=True)

    async def _progress_lines(self, begin: float) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)
            counts = await self._db_counts()
            acked = len(self.probe.acked) if self.probe else 0
            self.echo(
                f"t+{time.monotonic() - begin:5.0f}s  committed "
                f"{self.ledger.count('committed')}  {counts}  probe acks {acked}"
            )

    async def _inject_one(self, planned: PlannedFault) -> None:
        actions: dict[str, Callable[[FaultRecord, PlannedFault], Awaitable[None]]] = {
            "kill_stream_leader": self._kill_stream_leader,
            "kill_meta_leader": self._kill_meta_leader,
            "partition": self._partition,
            "rolling_restart": self._rolling_restart,
        }
        record = FaultRecord(planned.kind, "", planned.at, time.time(), affects=frozenset({"*"}))
        try:
            await actions[planned.kind](record, planned)
        except Exception as exc:  # reported in the table, and a violation
            record.ok = False
            record.detail = f"{record.detail} {type(exc).__name__}: {exc}".strip()
            log.exception("fault %s failed", planned.kind)
        record.ended = max(record.ended, time.time())
        self.records.append(record)
        self.timeline.records.append(record)
        self.echo(record.line(self.timeline.origin))

    async def _stream_leader(self, stream: str) -> str:
        """The server name leading ``stream`` (retried through an election)."""
        assert self.nc is not None
        js = self.nc.jetstream(timeout=2)
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

    async def _settle_world(self) -> None:
        """No toxic left, every proxy enabled, every node and role running."""
        await asyncio.to_thread(self.world.client.reset)
        cluster = self.world.nodes()
        for index, node in enumerate(cluster.nodes):
            if not node.running:
                self.timeline.note(f"{cluster.node_name(index)} was down after the faults")
                await asyncio.to_thread(cluster.start_node, index, wait=False)
        await asyncio.to_thread(cluster.wait_ready, HEAL_TIMEOUT)
        for role in self.world.roles.values():
            if not role.alive:
                role.start()

    async def _recoveries(self) -> tuple[list[float | None], float | None]:
        """Per fault: its recovery time, and the latency before the first (chaos.recovery)."""
        processed = await processed_times(self.world.topo, self.world.direct_dsn)
        starts = [r.started for r in self.records]
        return recovery_times(processed, self.ledger.intents.values(), starts)


async def run_cluster_scenario(config: RunConfig, scenario: str, size: str = "ci") -> ClusterResult:
    """Run one cluster scenario (see the module docstring)."""
    return await ClusterRun(config, scenario, size).run_cluster()


def main_cluster(config: RunConfig, scenario: str) -> int:
    """``python -m chaos.run --scenario cluster…``: run it, print the table; 0 when it passes."""
    if config.schedule not in SIZES:
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_cluster_scenario(config, scenario, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"scenario could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(render_cluster_table(result))
    print(f"\nreport: {config.run_dir}/cluster.json, cluster.txt, logs/")
    return 0 if result.ok else 1
