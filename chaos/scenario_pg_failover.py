"""The PostgreSQL failover drill (issue 28): the primary SIGKILLed mid-workload, the standby
promoted, nothing acknowledged lost, every role carrying on by itself.

``python -m chaos.run --scenario pg-failover [--schedule soak]``.

The world (:class:`PgFailoverWorld`) is the ordinary run's (:mod:`chaos.world`) with its one
PostgreSQL replaced by a pair (:class:`devstack.postgres_pair.PostgresPair`): a primary and
a streaming standby replicating **synchronously** (``synchronous_standby_names = '*'``,
``synchronous_commit = on``: a COMMIT returns only once the standby has flushed it). Every
context database of the run lives on the pair: physical replication copies a whole server,
so a failover moves every database at once, as it does for a CloudNativePG cluster holding
them (the drill fails over the target databases the handlers and consumers write to and the
source databases the producers and publishers use, in one go). Every role connects
**straight** to both servers with a multi-host DSN that asks for the writable one
(``postgresql://…@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``), not
through a proxy: a proxy in front of a dead server accepts the connection and then drops it,
which a client cannot tell from a server that failed mid-handshake. Their NATS and handler
links are proxied as in every run (no toxic is put on them).

The fault, during the workload of the ordinary run (:mod:`chaos.workload`):

``pg_failover``  SIGKILL the primary (postmaster and every backend at once), wait
                 ``promote_after`` seconds (the time an operator such as CloudNativePG needs
                 to decide the primary is gone), promote the standby with ``pg_promote()``;
                 in the long version the lost server then comes back on its port as the new
                 primary's synchronous standby (a fresh base backup), so the next failover
                 goes the other way. In the CI version the promoted server runs alone to
                 the end: commits no longer wait for anyone (production re-creates a
                 standby at once; CloudNativePG does).

What it shows, besides the ordinary invariants (:mod:`chaos.accounting`: 0 lost, dead
letters exactly the expected set, each id once per stream, 0 effects applied twice):

* **acknowledged but missing: 0** — every commit whose COMMIT returned to the producer
  (the ledger's ``committed``, taken before the uncertain ones are resolved) is in the
  outbox of the new primary afterwards;
* **no role restarted** — the publishers, consumers, handlers and the router reconnect to
  the promoted server on their own (:meth:`chaos.run.Chaos._monitor` restarts and counts a
  role that died);
* per failover, **recovery time**: from the kill to the first event committed after it
  being processed, in the slowest durable; and **writes back**: from the kill to the first
  commit the producers saw acknowledged again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from chaos.accounting import Accounts
from chaos.faults import FaultRecord
from chaos.recovery import processed_times, recovery_times
from chaos.run import REACH_ERRORS, Chaos, RunConfig
from chaos.scenarios import READY_LINES
from chaos.schedule import Schedule
from chaos.workload import Producer, plan_events
from chaos.world import CRASHABLE_PG, Tuning, World
from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from devstack.postgres_pair import PostgresPair
from shared.adapters.nats import connect_nats

log = logging.getLogger("chaos.pg_failover")

#: The ``--scenario`` name.
SCENARIO = "pg-failover"
#: Ledger statuses of a commit whose outcome the producer did not learn.
UNSURE = ("uncertain", "pending")
#: Seconds before a fresh acknowledged commit counts as "just before the kill" (the commits
#: most at risk: the standby may have had them for milliseconds only).
AT_RISK_SECONDS = 5.0


@dataclass(frozen=True)
class FailoverSize:
    """How big the drill runs."""

    seconds: float
    events: int
    drain_timeout: float
    #: Failovers, spread evenly over the fault phase.
    failovers: int = 1
    #: Seconds from the kill to the promotion.
    promote_after: float = 2.0
    #: Whether the lost server comes back as the new primary's standby after each failover.
    rejoin: bool = False


SIZES: dict[str, FailoverSize] = {
    "ci": FailoverSize(45.0, 360, 150.0),
    "soak": FailoverSize(600.0, 12_000, 400.0, failovers=5, promote_after=5.0, rejoin=True),
}


def failover_times(size: FailoverSize) -> list[float]:
    """When each failover happens (seconds into the fault phase): evenly spread, the first
    after 40% of a slot so that the workload is in full flow."""
    slot = size.seconds / size.failovers
    return [round(k * slot + 0.4 * slot, 1) for k in range(size.failovers)]


class PgFailoverWorld(World):
    """The run's world on a primary/standby pair (see the module docstring)."""

    def __init__(self, run_dir: Path, seed: int, tuning: Tuning | None = None) -> None:
        super().__init__(run_dir, seed, tuning)
        self.pair: PostgresPair | None = None

    def pg_pair(self) -> PostgresPair:
        """The run's two PostgreSQL servers."""
        assert self.pair is not None, "the world is not started"
        return self.pair

    def postgres(self) -> PostgresServer:
        """The current primary."""
        return self.pg_pair().primary

    def direct_dsn(self, context: str) -> str:
        """The multi-host DSN of a context's database (whichever server is writable)."""
        return self.pg_pair().dsn(self.topo.context(context).database)

    async def _start_servers(self) -> None:
        self._pg_base = Path(tempfile.mkdtemp(prefix="ferry-chaos-pgpair-"))
        self._pg_base.chmod(0o711)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pair = PostgresPair(self._pg_base, logs=self.logs, extra_settings=CRASHABLE_PG)
        self.pg = self.pair.primary
        self.nats = NatsServer(self.run_dir / "nats")
        outcomes = await asyncio.gather(
            asyncio.to_thread(self.pair.start),
            asyncio.to_thread(self.nats.start),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _add_role(
        self,
        name: str,
        kind: str,
        args: list[str],
        *,
        links: tuple[str, ...],
        durables: frozenset[str] = frozenset(),
        handler_service: str | None = None,
    ) -> None:
        """As in :class:`World`, but a role's databases are the pair's multi-host DSNs."""
        super()._add_role(
            name,
            kind,
            args,
            links=tuple(link for link in links if link != "pg"),
            durables=durables,
            handler_service=handler_service,
        )
        if "pg" in links:
            pair = self.pg_pair()
            databases = {db: pair.dsn(db) for db in self.topo.databases()}
            self.roles[name].env["FERRY_DATABASES"] = json.dumps(databases)

    async def stop(self) -> None:
        """Stop every role, the proxy, NATS and whichever PostgreSQL still runs."""
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.roles.values()))
        if self.toxi is not None:
            await asyncio.to_thread(self.toxi.stop)
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        if self.pair is not None:
            await asyncio.to_thread(self.pair.stop)
        if self._pg_base is not None:
            shutil.rmtree(self._pg_base, ignore_errors=True)


@dataclass
class FailoverRow:
    """One failover's line of the results table."""

    at: float
    killed: str
    promoted: str
    promote_seconds: float
    writes_back: float | None
    recovery: float | None
    acked_at_risk: int
    detail: str
    ok: bool


@dataclass
class FailoverResult:
    """What the drill did and what became of its events."""

    size: str
    seed: int
    accounts: Accounts
    failovers: list[FailoverRow]
    acked: int
    acked_missing: list[str]
    restarts: dict[str, int]
    unexpected_exits: list[str]
    drained: bool
    drain_seconds: float | None
    duration: float
    run_dir: Path
    producer_errors: dict[str, int] = field(default_factory=dict)
    #: Commits whose outcome the producer could not know (the connection died in COMMIT),
    #: and how many of them the new primary's outbox holds.
    unsure: int = 0
    unsure_committed: int = 0
    notes: list[str] = field(default_factory=list)
    baseline_latency: float | None = None

    @property
    def role_restarts(self) -> int:
        """Restarts of any role (none is planned: every one was needed)."""
        return sum(self.restarts.values())

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        out = [] if self.drained else ["the drain did not finish in time"]
        out += self.accounts.violations
        if self.acked_missing:
            out.append(
                f"commits acknowledged, missing on the new primary: {len(self.acked_missing)}"
            )
        if self.role_restarts:
            out.append(f"roles needed a restart: {self.role_restarts}")
        out += [f"failover failed: {f.detail}" for f in self.failovers if not f.ok]
        out += [
            f"the pipeline did not recover after the failover at t+{f.at:.0f}s"
            for f in self.failovers
            if f.ok and f.recovery is None
        ]
        return out

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.violations

    def table(self) -> dict[str, Any]:
        """The results table (also written as ``pg-failover.json``)."""
        a = self.accounts
        durables = a.durables.values()
        return {
            "scenario": SCENARIO,
            "size": self.size,
            "seed": self.seed,
            "verdict": "PASS" if self.ok else "FAIL",
            "events committed": a.committed,
            "commit outcome unknown (connection lost)": self.unsure,
            "  of which in the new primary's outbox": self.unsure_committed,
            "failovers": sum(1 for f in self.failovers if f.ok),
            "lost": sum(len(d.lost) for d in durables),
            "effects applied twice": sum(len(d.double_effects) for d in durables),
            "dead letters (expected)": sum(d.expected_dead for d in durables),
            "dead letters (found)": sum(sum(d.dead_letters.values()) for d in durables),
            "ids twice in a stream": sum(len(c.stream_duplicates) for c in a.contexts.values()),
            "commits acknowledged to the producers": self.acked,
            "acknowledged but missing on the new primary": len(self.acked_missing),
            "role restarts": self.role_restarts,
            "latency before the failover (median s)": (
                None if self.baseline_latency is None else round(self.baseline_latency, 2)
            ),
            "per failover": [
                {
                    "at": f.at,
                    "killed": f.killed,
                    "promoted": f.promoted,
                    "promote seconds": f.promote_seconds,
                    "writes back seconds": f.writes_back,
                    "recovery seconds": f.recovery,
                    "acknowledged in the 5 s before the kill": f.acked_at_risk,
                    "detail": f.detail,
                }
                for f in self.failovers
            ],
            "producer errors": self.producer_errors,
            "drain seconds": self.drain_seconds,
            "duration seconds": round(self.duration, 1),
            "violations": self.violations,
            "notes": self.notes,
        }


def render_failover_table(result: FailoverResult) -> str:
    """The results table as text."""
    lines = [f"Scenario {SCENARIO} ({result.size}), seed {result.seed}"]
    for key, value in result.table().items():
        if key in ("scenario", "size", "seed", "violations", "notes", "per failover"):
            continue
        if isinstance(value, dict):
            lines.append(f"  {key}")
            lines += [f"      {k:<40}{v!s:>8}" for k, v in sorted(value.items())]
        else:
            lines.append(f"  {key:<46} {value}")
    lines.append("  per failover (recovery: kill to the first event committed after it processed)")
    for f in result.failovers:
        back = "-" if f.writes_back is None else f"{f.writes_back:.1f}s"
        rec = "-" if f.recovery is None else f"{f.recovery:.1f}s"
        lines.append(
            f"    t+{f.at:6.1f}s {f.killed} killed, {f.promoted} promoted:"
            f" writes back {back}, recovery {rec}, {f.acked_at_risk} acked in the 5 s before"
        )
        lines.append(f"        {f.detail}")
    lines += [f"  VIOLATED: {v}" for v in result.violations]
    lines += [f"  note: {n[:200]}" for n in result.notes[:12]]
    return "\n".join(lines)


class PgFailoverRun(Chaos):
    """The drill (see the module docstring)."""

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

    async def _roles_ready(self, timeout: float = 120.0) -> None:
        """Wait until every Ferry role says it serves (the kill must not hit a role's start)."""
        deadline = time.monotonic() + timeout
        waiting = [r for r in self.world.roles.values() if r.kind in READY_LINES]
        while waiting and time.monotonic() < deadline:
            waiting = [r for r in waiting if READY_LINES[r.kind] not in r.log_tail(20_000)]
            await asyncio.sleep(0.5)
        if waiting:
            self.timeline.note(f"not ready after {timeout:.0f}s: {[r.name for r in waiting]}")

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


async def run_failover_scenario(config: RunConfig, size: str = "ci") -> FailoverResult:
    """Run the drill (see the module docstring)."""
    return await PgFailoverRun(config, size).run_failover()


def main_failover(config: RunConfig) -> int:
    """``python -m chaos.run --scenario pg-failover``: run it, print the table; 0 if it passes."""
    if config.schedule not in SIZES:
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_failover_scenario(config, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"scenario could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(render_failover_table(result))
    print(f"\nreport: {config.run_dir}/pg-failover.json, pg-failover.txt, logs/")
    return 0 if result.ok else 1


__all__ = [
    "SCENARIO",
    "SIZES",
    "FailoverResult",
    "FailoverSize",
    "PgFailoverRun",
    "PgFailoverWorld",
    "failover_times",
    "main_failover",
    "render_failover_table",
    "run_failover_scenario",
]
