"""The engine of a chaos run: :class:`Chaos` starts the world, runs the fault phase (producers,
injected faults, progress lines, restarts of roles that died by themselves), settles the world,
waits for the drain, counts everything and writes the report.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
from nats.aio.client import Client as NATS

from chaos.accounting import Accounts, count_everything
from chaos.faults import FaultInjector, Timeline
from chaos.roles import READY_LINES
from chaos.run_config import RunConfig, RunResult, make_schedule
from chaos.run_report import render_summary, write_report
from chaos.schedule import Schedule
from chaos.workload import Ledger, Producer, plan_events
from chaos.world import World
from shared.access.streams import ROUTER_DURABLE
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import DATABASE_ERRORS

#: Seconds the producers may run past the fault phase to commit what outages delayed.
PRODUCER_GRACE = 60.0
#: Failing to reach PostgreSQL at all (it may be crashed, or restarting).
REACH_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, OSError)
#: After the drain condition first holds, it must still hold this many seconds later.
QUIET_SECONDS = 3.0


class Chaos:
    """One run, from the world's start to the report."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.echo = config.echo
        self.world = World(config.run_dir, config.seed)
        self.ledger = Ledger(config.run_dir / "ledger.jsonl")
        self.timeline = Timeline(origin=time.time())
        self.stopping = asyncio.Event()
        self.nc: NATS | None = None
        self.producers: list[Producer] = []

    async def run(self) -> RunResult:
        """Set up, inject, drain, count; always tear the world down."""
        started = time.monotonic()
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self.echo(f"chaos run: schedule {self.config.schedule}, seed {self.config.seed}")
        self.echo(f"run directory: {self.config.run_dir}")
        try:
            await self.world.start()
        except BaseException:
            await self.world.stop()  # whatever did start (servers, proxy, roles) goes down
            raise
        monitor = asyncio.create_task(self._monitor())
        try:
            schedule = make_schedule(self.config, self.world)
            self._print_plan(schedule)
            fault_seconds = await self._inject(schedule)
            await self._settle_world()
            drain = await self._drain(schedule)
            accounts = await self._count()
        finally:
            self.stopping.set()
            await asyncio.gather(monitor, return_exceptions=True)
            if self.nc is not None:
                await self.nc.close()
            await self.world.stop()
        result = RunResult(
            seed=self.config.seed,
            schedule=schedule,
            accounts=accounts,
            timeline=self.timeline,
            duration=time.monotonic() - started,
            fault_seconds=fault_seconds,
            drain_seconds=drain,
            drained=drain is not None,
            restarts={r.name: r.starts - 1 for r in self.world.roles.values()},
            unexpected_exits=[
                f"{e.role} exited with {e.code} at t+{e.at - self.timeline.origin:.1f}s"
                for r in self.world.roles.values()
                for e in r.unexpected
            ],
            producer={
                "transactions": sum(p.transactions for p in self.producers),
                "reconnects": sum(p.reconnects for p in self.producers),
                "errors": dict(self.ledger.errors),
            },
            run_dir=self.config.run_dir,
        )
        result.summary = render_summary(result)
        write_report(result)
        return result

    def _print_plan(self, schedule: Schedule) -> None:
        self.echo(
            f"plan: {schedule.events} events over {schedule.seconds:.0f}s, "
            f"{len(schedule.faults)} faults"
            + (f", {schedule.quiet_periods} quiet periods" if schedule.quiet_periods else "")
        )
        if len(schedule.faults) <= 40:
            for fault in schedule.faults:
                self.echo("  " + fault.describe())

    # -- the fault phase ---------------------------------------------------------------

    async def _inject(self, schedule: Schedule) -> float:
        intents = plan_events(self.world.topo, self.config.seed, schedule.events, schedule.seconds)
        contexts = sorted({i.context for i in intents})
        self.producers = [
            Producer(c, self.world.direct_dsn(c), intents, self.ledger) for c in contexts
        ]
        injector = FaultInjector(self.world, self.timeline, self.config.seed)
        begin = time.monotonic()
        self.timeline.origin = time.time()
        stop_producing = asyncio.Event()
        producing = [asyncio.create_task(p.run(begin, stop_producing)) for p in self.producers]
        faults = asyncio.create_task(self._run_faults(schedule, injector, begin))
        progress = asyncio.create_task(self._progress(begin, schedule))
        try:
            await faults
            _, late = await asyncio.wait(
                producing,
                timeout=max(begin + schedule.seconds + PRODUCER_GRACE - time.monotonic(), 1),
            )
            if late:
                self.timeline.note(f"{len(late)} producer(s) still late; stopping them")
            stop_producing.set()
            await asyncio.gather(*producing)
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        return time.monotonic() - begin

    async def _run_faults(self, schedule: Schedule, injector: FaultInjector, begin: float) -> None:
        tasks = []
        for planned in schedule.faults:
            delay = begin + planned.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(injector.inject(planned)))
        rest = begin + schedule.seconds - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)
        await asyncio.gather(*tasks)

    async def _roles_ready(self, timeout: float = 120.0) -> None:
        """Wait until every Ferry role says it serves (faults must not hit a role's start)."""
        deadline = time.monotonic() + timeout
        waiting = list(self.world.roles.values())
        while waiting and time.monotonic() < deadline:
            waiting = [
                r
                for r in waiting
                if r.kind in READY_LINES
                and not r.held_down  # a replica the run starts later
                and READY_LINES[r.kind] not in r.log_tail(20_000)
            ]
            await asyncio.sleep(0.5)
        if waiting:
            self.timeline.note(f"not ready after {timeout:.0f}s: {[r.name for r in waiting]}")

    async def _monitor(self) -> None:
        """Restart any role that died by itself, and record it."""
        while not self.stopping.is_set():
            now = time.time()
            for role in self.world.roles.values():
                exit_ = role.check_exit(now)
                if exit_ is not None:
                    last = exit_.log_tail.strip().splitlines()[-1:] or ["(empty log)"]
                    self.timeline.note(
                        f"{role.name} exited by itself (code {exit_.code}); restarting. "
                        f"Last log line: {last[0][:300]}"
                    )
                    role.start()
            await asyncio.sleep(0.5)

    async def _progress(self, begin: float, schedule: Schedule) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)
            elapsed = time.monotonic() - begin
            counts = await self._db_counts()
            self.echo(
                f"t+{elapsed:5.0f}s  committed {self.ledger.count('committed'):>6}/"
                f"{schedule.events}  {counts}  faults {len(self.timeline.records)}"
            )

    async def _db_counts(self) -> str:
        parts = []
        for context in sorted(self.world.topo.contexts):
            try:
                conn = await asyncpg.connect(self.world.direct_dsn(context), timeout=2)
            except REACH_ERRORS:
                return "(PostgreSQL unreachable)"
            try:
                row = await conn.fetchrow(
                    "SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL) p,"
                    " (SELECT count(*) FROM inbox_messages WHERE status = 'processed') d,"
                    " (SELECT count(*) FROM inbox_messages WHERE status = 'failed') f"
                )
            except DATABASE_ERRORS:
                return "(PostgreSQL unreachable)"
            finally:
                await conn.close()
            assert row is not None
            parts.append(
                f"{context}: published {row['p']}, inbox processed {row['d']} failed {row['f']}"
            )
        return " | ".join(parts)

    # -- the drain ---------------------------------------------------------------------

    async def _settle_world(self) -> None:
        """No toxic left, every proxy enabled, both servers and every role running."""
        await asyncio.to_thread(self.world.client.reset)
        for server in (self.world.postgres(), self.world.nats_server()):
            if not server.running:
                self.timeline.note(f"{type(server).__name__} was down after the faults")
                await asyncio.to_thread(server.start)
        for role in self.world.roles.values():
            if not role.alive:
                role.start()
        self.nc = await connect_nats(
            [self.world.nats_server().url], name="chaos-accounting", give_up_after=30
        )

    async def _drain(self, schedule: Schedule) -> float | None:
        """Seconds until everything settled, or None after the schedule's drain timeout."""
        begin = time.monotonic()
        await self._resolve_uncertain()
        expected: dict[str, list[str]] = {}
        for intent in self.ledger.by_status("committed"):
            expected.setdefault(intent.durable, []).append(intent.id)
        last_print = 0.0
        settled_since: float | None = None
        while time.monotonic() - begin < schedule.drain_timeout:
            state = await self._drain_state(expected)
            now = time.monotonic()
            if not state:
                settled_since = settled_since or now
                if now - settled_since >= QUIET_SECONDS:
                    drained = now - begin - QUIET_SECONDS
                    self.echo(f"drained in {drained:.1f}s")
                    return drained
            else:
                settled_since = None
                if now - last_print >= self.config.progress_every:
                    self.echo(f"drain t+{now - begin:5.0f}s  waiting for: {'; '.join(state)}")
                    last_print = now
            await asyncio.sleep(0.5)
        self.echo(f"NOT drained after {schedule.drain_timeout:.0f}s")
        return None

    async def _resolve_uncertain(self) -> None:
        """Commits whose outcome was unknown: look them up in the outbox now."""
        for context in sorted(self.world.topo.contexts):
            unsure = [
                i
                for i in self.ledger.intents.values()
                if i.context == context and i.status in ("uncertain", "pending")
            ]
            if not unsure:
                continue
            conn = await asyncpg.connect(self.world.direct_dsn(context), timeout=10)
            try:
                found = {
                    str(r["id"])
                    for r in await conn.fetch(
                        "SELECT id FROM outbox_events WHERE id = ANY($1::uuid[])",
                        [i.id for i in unsure],
                    )
                }
            finally:
                await conn.close()
            self.ledger.mark([i for i in unsure if i.id in found], "committed")
            self.ledger.mark([i for i in unsure if i.id not in found], "absent")

    async def _drain_state(self, expected: dict[str, list[str]]) -> list[str]:
        """What is still outstanding (empty when drained)."""
        waiting: list[str] = []
        try:
            await self._drain_databases(expected, waiting)
        except REACH_ERRORS as exc:
            return [f"database: {exc}"]
        return waiting + await self._consumers_waiting()

    async def _consumers_waiting(self) -> list[str]:
        """Every JetStream consumer of every durable (one per partition of an ordered one),
        and the router's, with messages pending or unacked, or unreachable."""
        assert self.nc is not None
        js = self.nc.jetstream()
        topo = self.world.topo
        consumers = [
            (d.stream, p.name) for n, d in topo.durables.items() for p in topo.consumers(n)
        ]
        consumers.append((self.world.topo.advisory_stream, ROUTER_DURABLE))
        waiting: list[str] = []
        for stream, durable in consumers:
            try:
                info = await js.consumer_info(stream, durable)
            except Exception as exc:  # NATS still coming back: report and poll again
                waiting.append(f"{durable}: {type(exc).__name__}")
                continue
            if info.num_pending or info.num_ack_pending:
                waiting.append(
                    f"{durable}: {info.num_pending} pending, {info.num_ack_pending} unacked"
                )
        return waiting

    async def _drain_databases(self, expected: dict[str, list[str]], waiting: list[str]) -> None:
        topo = self.world.topo
        for context, spec in sorted(topo.contexts.items()):
            if spec.stream is None:
                continue
            conn = await asyncpg.connect(self.world.direct_dsn(context), timeout=5)
            try:
                unpublished = await conn.fetchval(
                    "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
                )
            finally:
                await conn.close()
            if unpublished:
                waiting.append(f"{context}: {unpublished} unpublished")
        for durable, ids in sorted(expected.items()):
            target = topo.durables[durable].target
            conn = await asyncpg.connect(self.world.direct_dsn(target), timeout=5)
            try:
                settled = await conn.fetchval(
                    "SELECT count(*) FROM inbox_messages WHERE durable = $1"
                    " AND status IN ('processed', 'failed') AND message_id = ANY($2::uuid[])",
                    durable,
                    ids,
                )
            finally:
                await conn.close()
            if settled < len(ids):
                waiting.append(f"{durable}: {len(ids) - settled} of {len(ids)} unsettled")

    async def _count(self) -> Accounts:
        assert self.nc is not None
        dsns = {c: self.world.direct_dsn(c) for c in self.world.topo.contexts}
        return await count_everything(
            topology=self.world.topo,
            dsns=dsns,
            js=self.nc.jetstream(),
            ledger=self.ledger,
            faults=self.timeline.records,
        )
