"""The engine every run is handed: :class:`Engine` holds the world, the intent ledger and the
fault timeline, and does what every run does with them — start the world and always tear it
down (:meth:`Engine.session`), restart any role that dies by itself, play the workload with
a run's own steps beside it (:meth:`Engine.play`), settle the world, wait for the drain,
count. A run (:mod:`chaos.scenarios`) holds an engine; it does not extend one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from chaos.engine import db
from chaos.engine.accounting import Accounts, count_everything
from chaos.engine.config import RunConfig
from chaos.engine.faults import FaultRecord, Timeline
from chaos.engine.recovery import baseline_latency, processed_times, recovery_times
from chaos.engine.roles import READY_LINES, Role
from chaos.engine.workload import Intent, Ledger, Producer, plan_events
from chaos.engine.world import World
from shared.access.streams import ROUTER_DURABLE
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import DATABASE_ERRORS

log = logging.getLogger("chaos.engine")

#: Failing to reach PostgreSQL at all (it may be crashed, or restarting).
REACH_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, OSError)
#: After the drain condition first holds, it must still hold this many seconds later.
QUIET_SECONDS = 3.0
#: Seconds the producers get, after the play, to commit what faults delayed.
PRODUCER_LATE = 30.0

#: A line of progress: (seconds into the play, the databases' counts) -> the line.
ProgressLine = Callable[[float, str], str]


class Engine:
    """One run's world, ledger and timeline, and what every run does with them."""

    def __init__(self, config: RunConfig, world: World) -> None:
        self.config = config
        self.echo = config.echo
        self.world = world
        self.ledger = Ledger(config.run_dir / "ledger.jsonl")
        self.timeline = Timeline(origin=time.time())
        self.stopping = asyncio.Event()
        self.nc: NATS | None = None
        self.producers: list[Producer] = []

    # -- the world's life ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session(self, *banner: str) -> AsyncIterator[None]:
        """Start the world (and the monitor); whatever happens, tear it down afterwards."""
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        for line in banner:
            self.echo(line)
        try:
            await self.world.start()
        except BaseException:
            await self.world.stop()  # whatever did start (servers, proxy, roles) goes down
            raise
        monitor = asyncio.create_task(self._monitor())
        try:
            yield
        finally:
            self.stopping.set()
            await asyncio.gather(monitor, return_exceptions=True)
            if self.nc is not None:
                await self.nc.close()
            await self.world.stop()

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

    async def roles_ready(self, timeout: float = 120.0) -> None:
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

    async def connect(self, servers: list[str], name: str) -> NATS:
        """The run's own NATS connection (closed with the session)."""
        self.nc = await connect_nats(servers, name=name, give_up_after=30)
        return self.nc

    # -- the play ------------------------------------------------------------------------

    def workload(
        self, events: int, seconds: float, *, context: str | None = None, only: str | None = None
    ) -> Callable[[], list[Intent]]:
        """The plan of the ordinary workload (:func:`plan_events`): ``events`` over ``seconds``
        (of ``context``'s events only, of class ``only`` only, when given)."""
        return lambda: plan_events(
            self.world.topo, self.config.seed, events, seconds, context=context, only=only
        )

    def producer(self, context: str, intents: list[Intent]) -> Producer:
        """The producer of one context's planned events."""
        return Producer(context, self.world.direct_dsn(context), intents, self.ledger)

    async def play(
        self,
        plan: Callable[[], list[Intent]],
        seconds: float,
        during: Callable[[float], Awaitable[None]],
        *,
        progress: ProgressLine | None = None,
        producer: Callable[[str, list[Intent]], Producer] | None = None,
        grace: float | None = None,
        beside: Collection[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = (),
    ) -> float:
        """Commit the planned events for ``seconds`` while ``during(begin)`` runs the run's own
        steps (and each of ``beside`` runs until the producers stop); the seconds it took.

        The producers then get :data:`PRODUCER_LATE` seconds to finish, or, with ``grace``,
        until ``grace`` seconds past the end of the play."""
        begin = time.monotonic()
        self.timeline.origin = time.time()
        intents = plan()
        make = producer or self.producer
        self.producers = [make(c, intents) for c in sorted({i.context for i in intents})]
        stop = asyncio.Event()
        producing = [asyncio.create_task(p.run(begin, stop)) for p in self.producers]
        others = [asyncio.create_task(run(stop)) for run in beside]
        ticking = asyncio.create_task(self._progress(begin, progress or _committed_line(self)))
        try:
            await during(begin)
            if grace is None:
                await sleep_until(begin + seconds)
                timeout, late = PRODUCER_LATE, "producer(s) late; stopped"
            else:
                timeout = max(begin + seconds + grace - time.monotonic(), 1)
                late = "producer(s) still late; stopping them"
            _, lagging = await asyncio.wait(producing, timeout=timeout)
            if lagging:
                self.timeline.note(f"{len(lagging)} {late}")
            stop.set()
            await asyncio.gather(*producing, *others)
        finally:
            stop.set()
            ticking.cancel()
            await asyncio.gather(ticking, *others, return_exceptions=True)
        return time.monotonic() - begin

    async def _progress(self, begin: float, line: ProgressLine) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)
            counts = await self.db_counts()
            self.echo(line(time.monotonic() - begin, counts))

    async def db_counts(self) -> str:
        """Published, processed and failed, per context (a progress line's part)."""
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

    async def record_fault(
        self, record: FaultRecord, act: Awaitable[None], records: list[FaultRecord]
    ) -> None:
        """Run one fault of a run's own plan: a failure is reported (the record says so, not
        ok), never raised; the record goes on ``records`` and the timeline, and is echoed."""
        try:
            await act
        except Exception as exc:  # reported in the table, and a violation
            record.ok = False
            record.detail = f"{record.detail} {type(exc).__name__}: {exc}".strip()
            log.exception("fault %s failed", record.kind)
        record.ended = max(record.ended, time.time())
        records.append(record)
        self.timeline.records.append(record)
        self.echo(record.line(self.timeline.origin))

    # -- after the play --------------------------------------------------------------------

    async def settle(self, *, keep_down: Collection[str] = (), servers: bool = True) -> None:
        """No toxic left, every proxy enabled, the servers (``servers``) and every role
        running but those in ``keep_down``."""
        await asyncio.to_thread(self.world.client.reset)
        for server in (self.world.postgres(), self.world.nats_server()) if servers else ():
            if not server.running:
                self.timeline.note(f"{type(server).__name__} was down after the faults")
                await asyncio.to_thread(server.start)
        self.start_roles(keep_down)

    def start_roles(self, keep_down: Collection[str] = ()) -> None:
        """Start every role that is not running (but those in ``keep_down``)."""
        for role in self.world.roles.values():
            if not role.alive and role.name not in keep_down:
                role.start()

    async def wait_drained(
        self,
        outstanding: Callable[[], Awaitable[list[str]]],
        timeout: float,
        *,
        begin: float | None = None,
        line: str = "drain t+{:5.0f}s  waiting for: {}",
        tell_last: bool = False,
    ) -> float | None:
        """Seconds until ``outstanding()`` stayed empty for :data:`QUIET_SECONDS`, or None
        after ``timeout`` (``tell_last``: the last outstanding items are echoed then)."""
        begin = time.monotonic() if begin is None else begin
        last_print, quiet_since, waiting = 0.0, None, []
        while time.monotonic() - begin < timeout:
            waiting = await outstanding()
            now = time.monotonic()
            if not waiting:
                quiet_since = quiet_since or now
                if now - quiet_since >= QUIET_SECONDS:
                    drained = now - begin - QUIET_SECONDS
                    self.echo(f"drained in {drained:.1f}s")
                    return drained
            else:
                quiet_since = None
                if now - last_print >= self.config.progress_every:
                    self.echo(line.format(now - begin, "; ".join(waiting)))
                    last_print = now
            await asyncio.sleep(0.5)
        told = f": {'; '.join(waiting)}" if tell_last else ""
        self.echo(f"NOT drained after {timeout:.0f}s{told}")
        return None

    async def drain(self, timeout: float) -> float | None:
        """Every committed event settled in its inbox, every outbox published, every
        consumer idle: the seconds it took, or None after ``timeout``."""
        begin = time.monotonic()
        await self.resolve_uncertain()
        expected: dict[str, list[str]] = {}
        for intent in self.ledger.by_status("committed"):
            expected.setdefault(intent.durable, []).append(intent.id)

        async def outstanding() -> list[str]:
            waiting: list[str] = []
            try:
                await self._drain_databases(expected, waiting)
            except REACH_ERRORS as exc:
                return [f"database: {exc}"]
            return waiting + await self.consumers_waiting()

        return await self.wait_drained(outstanding, timeout, begin=begin)

    async def resolve_uncertain(self) -> None:
        """Commits whose outcome was unknown: look them up in the outbox now."""
        for context in sorted(self.world.topo.contexts):
            unsure = [
                i
                for i in self.ledger.intents.values()
                if i.context == context and i.status in ("uncertain", "pending")
            ]
            if not unsure:
                continue
            rows = await db.fetch(
                self.world.direct_dsn(context),
                "SELECT id FROM outbox_events WHERE id = ANY($1::uuid[])",
                [i.id for i in unsure],
            )
            found = {str(r["id"]) for r in rows}
            self.ledger.mark([i for i in unsure if i.id in found], "committed")
            self.ledger.mark([i for i in unsure if i.id not in found], "absent")

    async def consumers_waiting(self) -> list[str]:
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
            unpublished = await db.fetchval(
                self.world.direct_dsn(context),
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL",
                timeout=5,
            )
            if unpublished:
                waiting.append(f"{context}: {unpublished} unpublished")
        waiting += await self.unsettled(
            expected,
            "SELECT count(*) FROM inbox_messages WHERE durable = $1"
            " AND status IN ('processed', 'failed') AND message_id = ANY($2::uuid[])",
        )

    async def unsettled(self, expected: dict[str, list[str]], settled_sql: str) -> list[str]:
        """``durable: N of M unsettled`` for each durable whose ids (``expected``) are not all
        settled; ``settled_sql`` counts the settled ones ($1 the durable, $2 the ids)."""
        out = []
        for durable, ids in sorted(expected.items()):
            target = self.world.topo.durables[durable].target
            settled = await db.fetchval(
                self.world.direct_dsn(target), settled_sql, durable, ids, timeout=5
            )
            if settled < len(ids):
                out.append(f"{durable}: {len(ids) - settled} of {len(ids)} unsettled")
        return out

    # -- the count -------------------------------------------------------------------------

    async def count(self) -> Accounts:
        """The invariants of every run (:mod:`chaos.engine.accounting`)."""
        assert self.nc is not None
        return await count_everything(
            topology=self.world.topo,
            dsns=self.dsns(),
            js=self.nc.jetstream(),
            ledger=self.ledger,
            faults=self.timeline.records,
        )

    async def recoveries(
        self,
        records: list[FaultRecord],
        *,
        tolerate_unreachable: bool = False,
        intents: list[Intent] | None = None,
    ) -> tuple[list[float | None], float | None]:
        """Per fault of ``records``: its recovery, and the latency before the first
        (:mod:`chaos.engine.recovery`), measured on ``intents`` (every planned event by
        default); ``tolerate_unreachable``: all None when the databases cannot be
        reached."""
        try:
            processed = await processed_times(self.world.topo, self.world.direct_dsn)
        except REACH_ERRORS:
            if not tolerate_unreachable:
                raise
            return [None for _ in records], None
        if intents is None:
            intents = list(self.ledger.intents.values())
        figures = recovery_times(records, processed, intents)
        return figures, baseline_latency(processed, intents, records)

    def outcome(self, started: float, drain: float | None) -> dict[str, Any]:
        """What a result says of the run as a whole (the fields of
        :class:`~chaos.engine.results.CountedResult` the engine knows)."""
        return {
            "restarts": self.restarts(),
            "unexpected_exits": self.unexpected_exits(),
            "drained": drain is not None,
            "drain_seconds": drain,
            "duration": time.monotonic() - started,
            "run_dir": self.config.run_dir,
            "notes": [t for _, t in self.timeline.events],
        }

    def dsns(self) -> dict[str, str]:
        """Every context's direct DSN."""
        return {c: self.world.direct_dsn(c) for c in self.world.topo.contexts}

    def restarts(self) -> dict[str, int]:
        """Restarts of each role (its starts but the first)."""
        return {r.name: r.starts - 1 for r in self.world.roles.values()}

    def unexpected_exits(self, roles: Collection[Role] | None = None) -> list[str]:
        """Each exit of a role (of ``roles``, or of any) that nobody asked for."""
        return [
            f"{e.role} exited with {e.code} at t+{e.at - self.timeline.origin:.1f}s"
            for r in (self.world.roles.values() if roles is None else roles)
            for e in r.unexpected
        ]


def _committed_line(engine: Engine) -> ProgressLine:
    def line(elapsed: float, counts: str) -> str:
        return f"t+{elapsed:5.0f}s  committed {engine.ledger.count('committed')}  {counts}"

    return line


async def sleep_until(moment: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``moment`` (not at all if it has)."""
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
