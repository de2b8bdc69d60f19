"""The ``ordering`` scenario: per-key order under kills, restarts, retries, dead letters,
replays and a replica set that grows and shrinks (issue 23).

``python -m chaos.run --scenario ordering [--schedule soak]``

**World.** Both durables of sea-vibespro are declared ``ordering: key`` —
``vibespro__from_sea`` with ``on_dead_letter: hold``, ``sea__from_vibespro`` with
``skip`` — and both streams get :data:`PARTITIONS` partitions. Each durable has
:data:`REPLICAS` consumer processes planned; two run from the start.

**Workload** (:mod:`chaos.scenarios.ordering.workload`): each context's events go to a fixed set of
keys, several events per key, committed in plan order by one producer per context.

**Play**, per cycle (one in CI; a cycle a minute in the soak), at fractions of it: SIGKILL
of consumer replicas (restarted 0.3-2 s later, as a supervisor would) and of both
publishers, the replica set grown to 3, every role's NATS connection reset for a second
(deliveries in transit lost: a partition's consumer sees the jump in its sequence and
waits for their redelivery), what nats-server sends one replica swallowed for two seconds
(the same loss, certain while it has pull requests open), nats-server SIGKILLed and
restarted on its store, the set shrunk to 1 (one replica stopped with SIGTERM — it sheds
its partitions cleanly — and one SIGKILLed for good, so its partitions are taken over),
then the last replica killed and restarted. Meanwhile the **operator** looks at the held
heads every few seconds (what ``ferry parked list`` shows): a ``fixed`` event whose bug is
fixed by now is replayed (the function ``ferry dlq replay`` calls), anything else held is
discarded with ``ferry dlq discard`` (the command itself), which releases its key.

**Count** (:mod:`chaos.scenarios.ordering.accounting`): besides the scenario invariants (nothing
stuck or lost, no effect applied twice, no unexpected exit), per key the applied order
against the commit order: 0 order violations, every class's outcome as planned, nothing
left parked; the table gives keys, events, parked, released, takeovers, and the recovery
per fault kind (:mod:`chaos.engine.recovery`; each durable's scale-down is one fault,
``scale_down``, on the timeline).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from chaos.engine.config import RunConfig, Size
from chaos.engine.faults import FaultInjector, FaultRecord
from chaos.engine.roles import ROOT
from chaos.engine.scenario import Play, ScenarioRun
from chaos.engine.schedule import PlannedFault
from chaos.engine.settled import Settled
from chaos.engine.stall import arm_and_wait, disarm_fully, terminate_stalled
from chaos.engine.tuning import DURABLE_CLOCKS, Tuning
from chaos.engine.workload import Intent
from chaos.scenarios.ordering.accounting import count_order
from chaos.scenarios.ordering.workload import (
    HELD_PARK,
    arm_fixes,
    behind_no_failure,
    fix_time,
    install_traces,
    plan_ordered,
)
from shared.adapters import parked_queue
from shared.adapters.dead_letters.replay import (
    NotReplayable,
    replay,
    republish_unconfirmed,
)
from shared.adapters.nats import connect_nats
from shared.waits import sleep_unless

#: The durable whose dead letters hold their key, and the one whose dead letters skip.
HOLD, SKIP = "vibespro__from_sea", "sea__from_vibespro"
#: Partitions of both streams (``FERRY_CHAOS_PARTITIONS`` overrides).
PARTITIONS = int(os.environ.get("FERRY_CHAOS_PARTITIONS", "4"))
#: Seconds every NATS link resets its connections (deliveries in transit are lost: the
#: server counts them delivered, the consumer never sees them).
RESET_SECONDS = 1.0
#: Seconds one consumer replica's NATS link swallows what the server sends it.
BLACKHOLE_SECONDS = 2.0
#: Consumer processes planned per durable, and how many run from the start.
REPLICAS, AT_START = 3, 2
#: Seconds between the operator's looks at the held heads.
OPERATOR_EVERY = 3.0
#: Keys per context, by schedule.
KEYS = {"ci": 24, "soak": 200}
#: The ordered durables' ack_wait: short, as an ordered durable's should be (heartbeats
#: keep its calls alive), since a partition lease must outlast it.
ORDERED_ACK_WAIT = "2s"
#: A partition lease for takeovers measured in seconds: it outlasts ack_wait (2 s), the
#: pull requests' lifetime (1 s) and the margin, with about 2.4 s to work between renewals.
LEASE_TTL = "6"


def ordering_tuning() -> Tuning:
    """Ordered durables, partitioned streams, three consumer replicas planned."""
    return Tuning(
        clocks={**DURABLE_CLOCKS, "ack_wait": ORDERED_ACK_WAIT},
        settings={"consumer": {"FERRY_PARTITION_LEASE_TTL": LEASE_TTL}},
        durables={
            HOLD: {"ordering": "key", "on_dead_letter": "hold"},
            SKIP: {"ordering": "key", "on_dead_letter": "skip"},
        },
        streams={c: {"partitions": PARTITIONS} for c in ("sea", "vibespro")},
        consumer_replicas=REPLICAS,
        replicas_at_start=AT_START,
    )


class Ordering(Play):
    """The ordering scenario (see the module docstring)."""

    sizes = {"ci": Size(60.0, 480, 150.0), "soak": Size(600.0, 12_000, 400.0, rounds=10)}

    def __init__(self, run: ScenarioRun) -> None:
        super().__init__(run)
        self.retired: set[str] = set()
        self.operator_done = asyncio.Event()
        self.operator: asyncio.Task[None] | None = None
        self.injector = FaultInjector(run.world, run.timeline, run.config.seed)
        self.planned: dict[str, Intent] = {}

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """See :func:`ordering_tuning`."""
        return ordering_tuning()

    # -- the play ---------------------------------------------------------------------

    async def before(self) -> None:
        """The traces of the applied order, in every target database."""
        topo = self.run.world.topo
        for target in sorted({d.target for d in topo.durables.values()}):
            await install_traces(self.run.world.direct_dsn(target))

    def plan(self) -> list[Intent]:
        """Several events per key, each key's fixed events armed to be fixed later."""
        keys = KEYS.get(self.run.size_name, KEYS["ci"])
        size = self.run.size
        intents = plan_ordered(
            self.run.world.topo, self.run.config.seed, size.events, size.seconds, keys
        )
        arm_fixes(intents, self.run.timeline.origin)
        self.planned = {i.id: i for i in intents}
        return intents

    async def during(self, begin: float) -> None:
        """The operator, and the cycles of faults and scaling."""
        self.operator = asyncio.create_task(self._operate())
        cycles = max(self.run.size.rounds, 1)
        length = self.run.size.seconds / cycles
        for cycle in range(cycles):
            await self._cycle(begin + cycle * length, length, first=cycle == 0)

    async def _cycle(self, start: float, length: float, *, first: bool) -> None:
        """One cycle of faults and scaling (see the module docstring)."""

        async def at(fraction: float) -> None:
            delay = start + fraction * length - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

        timetable: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (0.10, partial(self._kill_replica, HOLD, 1)),
            (0.15, partial(self._fault, "kill_publisher", "sea")),
            (0.20, partial(self._kill_replica, SKIP, 2)),
            (0.22, partial(self._kill_in_hold_window, 0.12 * length)),
            (0.30, partial(self._scale, 3)),
            (0.35, partial(self._fault, "nats_reset_peer", "", RESET_SECONDS)),
            (0.37, partial(self._blackhole, HOLD, 1)),
            (0.40, partial(self._fault, "kill_nats", "")),
            (0.45, partial(self._kill_replica, SKIP, 1)),
            (0.50, partial(self._fault, "kill_publisher", "vibespro")),
            (0.55, partial(self._kill_replica, HOLD, 3)),
            (0.65, partial(self._scale, 1)),
            (0.75, partial(self._kill_replica, HOLD, 1)),
            (0.85, partial(self._kill_replica, SKIP, 1)),
        ]
        if not first:
            await self._scale(2)
        for fraction, step in timetable:
            await at(fraction)
            await step()
        await at(1.0)

    async def _fault(self, kind: str, target: str, seconds: float = 0.0) -> None:
        planned = PlannedFault(time.time() - self.run.timeline.origin, kind, target, seconds)
        record = await self.injector.inject(planned)
        if record.ok:
            self.run.faults[kind] += 1

    async def _blackhole(self, durable: str, replica: int) -> None:
        """Swallow what nats-server sends one consumer replica (if it runs) for
        :data:`BLACKHOLE_SECONDS`: the deliveries of its partitions' open pull requests
        are lost in transit."""
        role = self.run.world.consumer_replicas(durable)[replica - 1]
        if role.name in self.retired or not role.alive:
            return
        await self._fault("nats_blackhole", role.name, BLACKHOLE_SECONDS)

    async def _kill_replica(self, durable: str, replica: int) -> None:
        """SIGKILL one consumer replica (if it runs) and restart it 0.3-2 s later."""
        role = self.run.world.consumer_replicas(durable)[replica - 1]
        if role.name in self.retired or not role.alive:
            return
        record = FaultRecord(
            "kill_consumer", role.name, time.time() - self.run.timeline.origin, time.time(),
            affects=role.durables,
        )  # fmt: skip
        async with self.injector.lock(role.name):
            await self.injector._kill_and_restart(record, role)
        record.ended = time.time()
        self.run.timeline.records.append(record)
        self.run.faults["kill_consumer"] += 1

    async def _kill_in_hold_window(self, wait: float) -> None:
        """SIGKILL the hold durable's replicas while one is between a held head's dead
        letter and the parking of its key (stalled there by a trigger), then restart them."""
        table, where = HELD_PARK
        dsn = self.run.world.direct_dsn(self.run.world.topo.durables[HOLD].target)
        record = FaultRecord(
            "kill_consumer_in_window", HOLD, time.time() - self.run.timeline.origin, time.time(),
            affects=frozenset({HOLD}),
        )  # fmt: skip
        async with self.injector.lock("pg"):
            conn = await asyncpg.connect(dsn, timeout=10)
            try:
                stalled = await arm_and_wait(conn, table, where, wait)
                victims = [r for r in self.run.world.consumer_replicas(HOLD) if r.alive]
                if stalled:
                    for role in victims:
                        await asyncio.to_thread(role.kill)
                    record.started = time.time()
                    await terminate_stalled(conn, where)  # rolls the park back, as the kill
            finally:
                await disarm_fully(conn, table, where)
                await conn.close()
        if not stalled:
            self.run.notes.append(f"no held head parked within {wait:.0f}s: window kill skipped")
            return
        await asyncio.sleep(self.injector.rng.uniform(0.3, 2.0))
        for role in victims:
            role.start()
        record.detail = f"in window (parking a held head); {len(victims)} replica(s) killed"
        record.ended = time.time()
        self.run.timeline.records.append(record)
        self.run.faults["kill_consumer_in_window (parking a held head)"] += 1

    async def _scale(self, wanted: int) -> None:
        """Grow or shrink every durable's replica set to ``wanted`` running processes."""
        for durable in (HOLD, SKIP):
            began = time.time()
            retired = await self._scale_durable(durable, wanted)
            if retired:
                self._scaled_down(durable, began, retired)
        self.run.timeline.note(f"replica set of each ordered durable scaled to {wanted}")

    async def _scale_durable(self, durable: str, wanted: int) -> list[str]:
        """One durable's replica set to ``wanted``; what became of each replica retired."""
        retired = []
        for index, role in enumerate(self.run.world.consumer_replicas(durable)):
            if index < wanted and (role.name in self.retired or not role.alive):
                self.retired.discard(role.name)
                role.start()
                self.run.faults["replica started (scale up)"] += 1
            elif index >= wanted and role.name not in self.retired and role.alive:
                self.retired.add(role.name)
                # Scale-down as Kubernetes does it (SIGTERM: the partitions are shed),
                # and a node lost for good (SIGKILL: they are taken over).
                if index == wanted:
                    await asyncio.to_thread(role.stop)
                    self.run.faults["replica stopped (SIGTERM, scale down)"] += 1
                    retired.append(f"{role.name} stopped (SIGTERM)")
                else:
                    await asyncio.to_thread(role.kill)
                    self.run.faults["replica killed for good (scale down)"] += 1
                    retired.append(f"{role.name} killed for good (SIGKILL)")
        return retired

    def _scaled_down(self, durable: str, began: float, retired: list[str]) -> None:
        """A scale-down on the timeline, as one fault: the partitions of the replicas taken
        away are handed over or taken over, and the recovery table says what that cost."""
        record = FaultRecord(
            "scale_down", durable, began - self.run.timeline.origin, began, time.time(),
            detail="; ".join(retired), affects=frozenset({durable}),
        )  # fmt: skip
        self.run.timeline.records.append(record)

    # -- the operator -----------------------------------------------------------------

    async def _operate(self) -> None:
        """Replay fixed held heads, discard the others, until the count begins."""
        nc = await connect_nats(
            [self.run.world.nats_server().url], name="chaos-operator", give_up_after=60
        )
        try:
            while not (self.operator_done.is_set() or self.run.engine.stopping.is_set()):
                try:
                    await self._operator_round(nc)
                except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                    self.run.notes.append(f"operator round failed: {type(exc).__name__}: {exc}")
                await sleep_unless(self.operator_done, OPERATOR_EVERY)
        finally:
            await nc.close()

    async def _operator_round(self, nc: NATS) -> None:
        durable = HOLD
        dsn = self.run.world.direct_dsn(self.run.world.topo.durables[durable].target)
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            heads = [
                h for h in await parked_queue.keys(conn, durable, None, 10_000)
                if h["head_state"] == "held"
            ]  # fmt: skip
            await republish_unconfirmed(
                conn, nc.jetstream(), durable, older_than=5.0, topology=self.run.world.topo
            )
            for head in heads:
                mid: uuid.UUID = head["head_id"]
                status = await conn.fetchval(
                    "SELECT status FROM dead_letters WHERE durable = $1 AND message_id = $2",
                    durable,
                    mid,
                )
                if status not in ("held", "dead", "parked"):
                    continue  # not recorded yet, or a replay is on its way
                intent = self.planned.get(str(mid))
                if intent is not None and intent.klass == "fixed":
                    if time.time() >= fix_time(intent, self.run.timeline.origin) + 0.5:
                        await self._replay(conn, nc, durable, mid)
                else:
                    await self._discard(durable, mid)
        finally:
            await conn.close()

    async def _replay(self, conn: asyncpg.Connection, nc: NATS, durable: str, mid: Any) -> None:
        try:
            await replay(
                conn, nc.jetstream(), durable=durable, message_id=mid, actor="chaos-operator",
                reason="the handler bug is fixed", automatic=False, topology=self.run.world.topo,
            )  # fmt: skip
        except NotReplayable as exc:
            self.run.notes.append(f"operator: replay refused: {exc}")
            return
        except Exception as exc:  # NATS away: the publish is healed by republish_unconfirmed
            self.run.notes.append(f"operator: replay of {mid} unconfirmed: {type(exc).__name__}")
        self.run.faults["operator replayed a held head"] += 1

    async def _discard(self, durable: str, mid: Any) -> None:
        """``ferry dlq discard DURABLE ID`` as an operator runs it."""
        argv = [sys.executable, "-m", "shared.cli", "dlq", "discard", durable, str(mid)]
        argv += ["--reason", "chaos: a poison event, given up", "--actor", "chaos-operator"]
        env = self.run.world.operator_env()
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0 and "released key" in done.stdout:
            self.run.faults["operator discarded a held head"] += 1
        else:
            out = (done.stdout + done.stderr).strip().replace("\n", " | ")
            self.run.notes.append(
                f"operator: ferry dlq discard {mid} exited {done.returncode}: {out}"
            )

    # -- settle, drain, count -----------------------------------------------------------

    async def settle(self) -> None:
        """As every run's, except that replicas scaled away stay away."""
        await self.run.engine.settle(keep_down=self.retired)

    def measured(self, intents: list[Intent]) -> list[Intent]:
        """Recovery is measured on the events no earlier event of their key held back: a
        key behind a failing event waits by design (a retry's back-off, ``max_deliver``
        attempts of an exhausting one, an operator's replay), not on a fault."""
        return behind_no_failure(intents)

    async def outstanding(self) -> list[str]:
        """Nothing parked, and every replay's copy processed."""
        waiting: list[str] = []
        for durable in (HOLD, SKIP):
            dsn = self.run.world.direct_dsn(self.run.world.topo.durables[durable].target)
            try:
                conn = await asyncpg.connect(dsn, timeout=5)
            except (OSError, asyncpg.PostgresError) as exc:
                return [*waiting, f"database: {exc}"]
            try:
                parked = await conn.fetchval(
                    "SELECT count(*) FROM parked_messages WHERE durable = $1", durable
                )
                replaying = await conn.fetchval(
                    "SELECT count(*) FROM dead_letters d WHERE durable = $1"
                    " AND status = 'replaying' AND NOT EXISTS (SELECT 1 FROM inbox_messages i"
                    " WHERE i.durable = d.durable AND i.message_id = d.message_id"
                    " AND i.status = 'processed')",
                    durable,
                )
            finally:
                await conn.close()
            if parked:
                waiting.append(f"{durable}: {parked} parked")
            if replaying:
                waiting.append(f"{durable}: {replaying} replays unprocessed")
        return waiting

    async def count_more(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        self.operator_done.set()
        if self.operator is not None:
            await asyncio.gather(self.operator, return_exceptions=True)
        order = await count_order(
            self.run.world.topo, self.run.engine.dsns(), self.run.ledger, settled
        )
        table = order.table()
        table["partitions per stream"] = PARTITIONS
        table["consumer replicas (start, most, least)"] = f"{AT_START}, {REPLICAS}, 1"
        return table, order.violations()
