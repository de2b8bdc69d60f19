"""The failover drill's run (:mod:`chaos.scenario_pg_failover`): :class:`PgFailoverRun`
starts the pair world, plays the workload with the failovers in it, settles, drains, and
counts what the producers saw acknowledged against the new primary's outbox."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import asyncpg

from chaos.faults import FaultRecord
from chaos.recovery import processed_times, recovery_times
from chaos.run import REACH_ERRORS, Chaos, RunConfig
from chaos.scenario_pg_failover_plan import SCENARIO, SIZES, FailoverSize, failover_times
from chaos.scenario_pg_failover_report import FailoverResult, FailoverRow, render_failover_table
from chaos.scenario_pg_failover_world import PgFailoverWorld
from chaos.schedule import Schedule
from chaos.workload import Producer, plan_events
from shared.adapters.nats import connect_nats

log = logging.getLogger("chaos.pg_failover")

#: Ledger statuses of a commit whose outcome the producer did not learn.
UNSURE = ("uncertain", "pending")
#: Seconds before a fresh acknowledged commit counts as "just before the kill" (the commits
#: most at risk: the standby may have had them for milliseconds only).
AT_RISK_SECONDS = 5.0


class PgFailoverRun(Chaos):
    """The drill (see :mod:`chaos.scenario_pg_failover`)."""

    def __init__(self, config: RunConfig, size_name: str = "ci") -> None:
        super().__init__(config)
        self.size_name = size_name
        base = SIZES[size_name]
        self.size = FailoverSize(
            seconds=config.seconds or base.seconds,
            events=config.events or base.events,
            drain_timeout=config.drain_timeout or base.drain_timeout,
            failovers=base.failovers,
            promote_after=base.promote_after,
            rejoin=base.rejoin,
        )
        self.world: PgFailoverWorld = PgFailoverWorld(config.run_dir, config.seed)
        self.records: list[FaultRecord] = []
        self.promoted: list[tuple[str, str, float]] = []
        self.acked: set[str] = set()

    async def run_failover(self) -> FailoverResult:
        """Start, play, settle, drain, count; always tear the world down."""
        started = time.monotonic()
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        self.echo(f"scenario {SCENARIO} ({self.size_name}), seed {self.config.seed}")
        try:
            await self.world.start()
        except BaseException:
            await self.world.stop()
            raise
        monitor = asyncio.create_task(self._monitor())
        try:
            self.nc = await connect_nats(
                [self.world.nats_server().url], name="chaos-pg-failover", give_up_after=30
            )
            await self._roles_ready()
            await self._play()
            # What the producers saw acknowledged, before the uncertain ones are resolved.
            self.acked = {i.id for i in self.ledger.by_status("committed")}
            unsure = {i.id for i in self.ledger.intents.values() if i.status in UNSURE}
            await self._settle_world()
            schedule = Schedule(
                SCENARIO,
                self.config.seed,
                self.size.seconds,
                self.size.events,
                (),
                drain_timeout=self.size.drain_timeout,
            )
            drain = await self._drain(schedule)
            acked_missing = await self._acked_missing()
            accounts = await self._count()
            recoveries, baseline = await self._recoveries()
        finally:
            self.stopping.set()
            await asyncio.gather(monitor, return_exceptions=True)
            if self.nc is not None:
                await self.nc.close()
            await self.world.stop()
        origin = self.timeline.origin
        rows = []
        for record, (killed, promoted, took), rec in zip(
            self.records, self.promoted, recoveries, strict=True
        ):
            rows.append(
                FailoverRow(
                    at=round(record.started - origin, 1),
                    killed=killed,
                    promoted=promoted,
                    promote_seconds=round(took, 2),
                    writes_back=self._writes_back(record.started),
                    recovery=None if rec is None else round(rec, 2),
                    acked_at_risk=sum(
                        1
                        for i in self.ledger.intents.values()
                        if i.id in self.acked
                        and i.committed_at is not None
                        and record.started - AT_RISK_SECONDS <= i.committed_at < record.started
                    ),
                    detail=record.detail,
                    ok=record.ok,
                )
            )
        result = FailoverResult(
            size=self.size_name,
            seed=self.config.seed,
            accounts=accounts,
            failovers=rows,
            acked=len(self.acked),
            acked_missing=acked_missing,
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
            producer_errors=dict(self.ledger.errors),
            unsure=len(unsure),
            unsure_committed=sum(1 for i in unsure if self.ledger.intents[i].status == "committed"),
            notes=[t for _, t in self.timeline.events],
            baseline_latency=baseline,
        )
        out = self.config.run_dir
        (out / "pg-failover.json").write_text(
            json.dumps(result.table(), indent=2, default=str) + "\n"
        )
        (out / "pg-failover.txt").write_text(render_failover_table(result) + "\n")
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
        tasks = [asyncio.create_task(p.run(begin, stop)) for p in self.producers]
        progress = asyncio.create_task(self._progress_lines(begin))
        try:
            for at in failover_times(self.size):
                delay = begin + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._failover(at)
            rest = begin + self.size.seconds - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
            _, late = await asyncio.wait(tasks, timeout=30)
            if late:
                self.timeline.note(f"{len(late)} producer(s) late; stopped")
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)

    async def _progress_lines(self, begin: float) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)
            counts = await self._db_counts()
            self.echo(
                f"t+{time.monotonic() - begin:5.0f}s  committed "
                f"{self.ledger.count('committed')}  {counts}"
            )

    async def _failover(self, planned_at: float) -> None:
        pair = self.world.pg_pair()
        killed = f"pg{pair.primary_index + 1}"
        promoted = f"pg{2 - pair.primary_index}"
        record = FaultRecord(
            "pg_failover", killed, planned_at, time.time(), affects=frozenset({"*"})
        )
        took = 0.0
        try:
            state = await asyncio.to_thread(pair.sync_state)
            if state != "sync":
                raise RuntimeError(f"no synchronous standby before the kill: {state!r}")
            await asyncio.to_thread(pair.kill_primary)
            record.started = time.time()
            await asyncio.sleep(self.size.promote_after)
            took = await asyncio.to_thread(pair.promote)
            record.detail = (
                f"{killed} (primary) SIGKILLed; {promoted} promoted"
                f" {time.time() - record.started:.1f}s later (pg_promote {took:.2f}s)"
            )
            if self.size.rejoin:
                rejoin = await asyncio.to_thread(pair.rejoin)
                record.detail += (
                    f"; {killed} back as the synchronous standby ({rejoin:.1f}s base backup)"
                )
        except Exception as exc:  # reported in the table, and a violation
            record.ok = False
            record.detail = f"{record.detail} {type(exc).__name__}: {exc}".strip()
            log.exception("failover failed")
        record.ended = time.time()
        self.records.append(record)
        self.promoted.append((killed, promoted, took))
        self.timeline.records.append(record)
        self.echo(record.line(self.timeline.origin))

    # -- after the play ---------------------------------------------------------------------

    async def _settle_world(self) -> None:
        """No toxic left, NATS and every role running. The killed primary stays down (it
        would come back as a second primary: production rejoins it as a standby)."""
        await asyncio.to_thread(self.world.client.reset)
        nats_ = self.world.nats_server()
        if not nats_.running:
            self.timeline.note("nats-server was down after the faults")
            await asyncio.to_thread(nats_.start)
        for role in self.world.roles.values():
            if not role.alive:
                role.start()

    def _writes_back(self, since: float) -> float | None:
        """Seconds from ``since`` to the first commit acknowledged after it."""
        times = [
            i.committed_at
            for i in self.ledger.intents.values()
            if i.id in self.acked and i.committed_at is not None and i.committed_at >= since
        ]
        return round(min(times) - since, 2) if times else None

    async def _acked_missing(self) -> list[str]:
        """Commits the producers saw acknowledged that the new primary's outbox lacks."""
        missing: list[str] = []
        by_context: dict[str, list[str]] = {}
        for intent in self.ledger.intents.values():
            if intent.id in self.acked:
                by_context.setdefault(intent.context, []).append(intent.id)
        for context, ids in sorted(by_context.items()):
            conn = await asyncpg.connect(self.world.direct_dsn(context), timeout=10)
            try:
                rows = await conn.fetch(
                    "SELECT id::text AS id FROM outbox_events WHERE id = ANY($1::uuid[])", ids
                )
            finally:
                await conn.close()
            found = {r["id"] for r in rows}
            missing += [f"{context} {i}" for i in ids if i not in found]
        return missing

    async def _recoveries(self) -> tuple[list[float | None], float | None]:
        """Per failover: its recovery time, and the latency before the first
        (chaos.recovery); all None when the databases cannot be reached."""
        try:
            processed = await processed_times(self.world.topo, self.world.direct_dsn)
        except REACH_ERRORS:
            return [None for _ in self.records], None
        starts = [r.started for r in self.records]
        return recovery_times(processed, self.ledger.intents.values(), starts)
