"""The chaos run: ``python -m chaos.run [--schedule ci|soak] [--seconds N] [--seed S]``.

1. start a world of its own (:mod:`chaos.world`): PostgreSQL, nats-server, a Toxiproxy,
   and every role of sea-vibespro behind proxies;
2. for the schedule's duration, commit the planned events (:mod:`chaos.workload`) while
   injecting the planned faults (:mod:`chaos.faults`), restarting any role that dies by
   itself (and recording it), printing progress;
3. remove every toxic, make sure every server and role is up, and wait for the drain:
   every committed event settled, every JetStream consumer idle;
4. count everything (:mod:`chaos.accounting`), print the fault timeline and the summary,
   write them (``report.json``, ``summary.txt``, ``timeline.txt``) to the run directory.

Exit status: 0 when every invariant holds, 1 when one does not (the seed is printed so
the same plan can be run again), 2 when the run could not be set up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from chaos.accounting import Accounts, count_everything
from chaos.faults import FaultInjector, FaultRecord, Timeline
from chaos.schedule import (
    FAULT_KINDS,
    FaultSpecError,
    Schedule,
    Targets,
    ci_schedule,
    custom_schedule,
    parse_fault,
    soak_schedule,
)
from chaos.workload import Ledger, Producer, plan_events
from chaos.world import World
from shared.access.streams import ROUTER_DURABLE
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import DATABASE_ERRORS

log = logging.getLogger("chaos.run")

#: Seconds the producers may run past the fault phase to commit what outages delayed.
PRODUCER_GRACE = 60.0
#: Failing to reach PostgreSQL at all (it may be crashed, or restarting).
REACH_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, OSError)
#: The 3-node JetStream cluster's scenarios (:mod:`chaos.scenario_cluster`).
CLUSTER_CHOICES = (
    "cluster",
    "cluster-leader",
    "cluster-meta-leader",
    "cluster-partition",
    "cluster-rolling",
    "cluster-ci",
)
#: After the drain condition first holds, it must still hold this many seconds later.
QUIET_SECONDS = 3.0


@dataclass
class RunConfig:
    """What to run."""

    schedule: str = "ci"
    seed: int = 0
    seconds: float | None = None
    events: int | None = None
    run_dir: Path = Path(tempfile.gettempdir()) / "ferry-chaos"
    drain_timeout: float | None = None
    progress_every: float = 5.0
    #: ``AT:KIND[:TARGET[:DURATION]]`` faults of the ``custom`` schedule.
    faults: tuple[str, ...] = ()
    echo: Callable[[str], None] = field(default=print, repr=False)


@dataclass
class RunResult:
    """What happened."""

    seed: int
    schedule: Schedule
    accounts: Accounts
    timeline: Timeline
    duration: float
    fault_seconds: float
    drain_seconds: float | None
    drained: bool
    restarts: dict[str, int]
    unexpected_exits: list[str]
    producer: dict[str, Any]
    run_dir: Path
    summary: str = ""

    @property
    def ok(self) -> bool:
        """Drained in time and every invariant holds."""
        return self.drained and self.accounts.ok

    @property
    def violations(self) -> list[str]:
        """Every broken invariant (a failed drain included)."""
        extra = [] if self.drained else ["the drain did not finish in time"]
        return extra + self.accounts.violations


def make_schedule(config: RunConfig, world: World) -> Schedule:
    """The schedule the config names, aimed at the world's roles and links."""
    targets = Targets(
        publishers=tuple(sorted(c for c, s in world.topo.contexts.items() if s.stream)),
        consumers=tuple(sorted(world.topo.durables)),
        nats_roles=tuple(sorted({link.role for link in world.links_of("nats")})),
        pg_roles=tuple(sorted({link.role for link in world.links_of("pg")})),
        links=tuple(sorted(world.links)),
    )
    sizes: dict[str, Any] = {}
    if config.seconds is not None:
        sizes["seconds"] = config.seconds
    if config.events is not None:
        sizes["events"] = config.events
    if config.schedule == "ci":
        schedule = ci_schedule(config.seed, targets, **sizes)
    elif config.schedule == "soak":
        schedule = soak_schedule(config.seed, targets, **sizes)
    elif config.schedule == "custom":
        seconds = float(sizes.get("seconds", 60.0))
        planned = [parse_fault(text, targets, seconds) for text in config.faults]
        schedule = custom_schedule(config.seed, planned, **sizes)
    else:
        raise ValueError(f"unknown schedule {config.schedule!r} (ci, soak or custom)")
    if config.drain_timeout is not None:
        schedule = replace(schedule, drain_timeout=config.drain_timeout)
    return schedule


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


# -- the report --------------------------------------------------------------------------


def _row(label: str, *values: object, width: int = 24) -> str:
    return f"  {label:<38}" + "".join(f"{v!s:>{width}}" for v in values)


def render_timeline(timeline: Timeline) -> str:
    """Every fault and notable event, in order."""
    lines = [(r.started, r.line(timeline.origin)) for r in timeline.records]
    lines += [(at, f"t+{at - timeline.origin:7.2f}s  NOTE {text}") for at, text in timeline.events]
    return "\n".join(line for _, line in sorted(lines)) or "(no faults)"


def render_summary(result: RunResult) -> str:
    """The summary table of a run."""
    a = result.accounts
    verdict = "PASS" if result.ok else "FAIL"
    drain = f"{result.drain_seconds:.1f}s" if result.drain_seconds is not None else "NOT DRAINED"
    lines = [
        f"Chaos run '{result.schedule.name}', seed {result.seed}: {verdict}",
        f"  duration {result.duration:.1f}s (faults {result.fault_seconds:.1f}s, drain {drain})",
        "",
        "Events",
        _row("committed", a.committed, width=10),
        *(_row(f"  {klass}", n, width=10) for klass, n in sorted(a.by_class.items())),
        _row("commit outcome unknown → committed", a.uncertain_committed, width=10),
        _row("commit outcome unknown → not committed", a.uncertain_absent, width=10),
        _row("producer transactions", result.producer["transactions"], width=10),
        _row("producer reconnects", result.producer["reconnects"], width=10),
        "",
        "Faults injected",
    ]
    by_kind: Counter[str] = result.timeline.by_kind()
    for kind in FAULT_KINDS:
        if by_kind.get(kind):
            lines.append(_row(kind, by_kind[kind], width=10))
    failed = [r for r in result.timeline.records if not r.ok]
    window = [r for r in result.timeline.records if r.kind.endswith("in_window")]
    lines.append(_row("total", sum(by_kind.values()), width=10))
    if window:
        hit = sum(1 for r in window if r.detail.startswith("in window"))
        lines.append(_row("crash-window kills inside the window", f"{hit}/{len(window)}", width=10))
    if failed:
        lines.append(_row("faults that could not be injected", len(failed), width=10))
    lines += ["", _row("Per durable", *a.durables).replace("  Per", "Per", 1)]
    d = list(a.durables.values())
    reasons = sorted({r for c in d for r in c.dead_letters})
    lines += [
        _row("expected (committed)", *(c.expected for c in d)),
        _row("processed", *(c.processed for c in d)),
        *(_row(f"dead letters {r}", *(c.dead_letters.get(r, 0) for c in d)) for r in reasons),
        _row("expected dead letters (poison+exhausting)", *(c.expected_dead for c in d)),
        _row("LOST", *(len(c.lost) for c in d)),
        _row("outcome differs from class", *(len(c.wrong_outcome) for c in d)),
        _row("effects applied twice", *(len(c.double_effects) for c in d)),
        _row("handler calls", *(c.calls for c in d)),
        _row("redundant calls (already applied)", *(sum(c.redundant.values()) for c in d)),
        _row("  of which answered 409", *(c.redundant.get("409", 0) for c in d)),
        _row("  of which 5xx / unrecorded", *(_undecided(c.redundant) for c in d)),
        _row("redundant calls outside crash windows", *(len(c.unexplained) for c in d)),
        _row("duplicate deliveries absorbed by inbox", *(c.inbox_duplicates for c in d)),
        _row("ids twice in dead-letter stream", *(len(c.dlq_duplicates) for c in d)),
        "",
        _row("Per stream", *a.contexts).replace("  Per", "Per", 1),
        _row("committed", *(c.committed for c in a.contexts.values())),
        _row("in the stream", *(c.in_stream for c in a.contexts.values())),
        _row("ids twice in the stream", *(len(c.stream_duplicates) for c in a.contexts.values())),
        "",
        "Roles",
        *(_row(f"{name} restarts", n, width=10) for name, n in sorted(result.restarts.items())),
    ]
    if result.unexpected_exits:
        lines += ["", "Roles that exited by themselves:"] + [
            f"  {e}" for e in result.unexpected_exits
        ]
    lines += ["", "Invariants"]
    if result.ok:
        lines.append(
            "  all hold: 0 lost, dead letters exact, each id once per stream, no double effect"
        )
    for violation in result.violations:
        lines.append(f"  VIOLATED: {violation}")
    if not result.ok:
        lines.append(f"  re-run the same plan with --seed {result.seed}")
    return "\n".join(lines)


def _undecided(redundant: Counter[str]) -> int:
    return sum(n for status, n in redundant.items() if status == "None" or status.startswith("5"))


def write_report(result: RunResult) -> None:
    """summary.txt, timeline.txt and report.json in the run directory."""
    out = result.run_dir
    (out / "summary.txt").write_text(result.summary + "\n")
    (out / "timeline.txt").write_text(render_timeline(result.timeline) + "\n")
    doc = {
        "seed": result.seed,
        "schedule": result.schedule.name,
        "ok": result.ok,
        "duration": result.duration,
        "fault_seconds": result.fault_seconds,
        "drain_seconds": result.drain_seconds,
        "violations": result.violations,
        "faults_by_kind": dict(result.timeline.by_kind()),
        "faults": [_fault_doc(r, result.timeline.origin) for r in result.timeline.records],
        "notes": [[at - result.timeline.origin, text] for at, text in result.timeline.events],
        "accounts": _accounts_doc(result.accounts),
        "restarts": result.restarts,
        "unexpected_exits": result.unexpected_exits,
        "producer": result.producer,
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def _plain(value: Any) -> Any:
    """JSON-ready copy (``asdict`` would rebuild a Counter from pairs, counting them)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def _fault_doc(record: FaultRecord, origin: float) -> dict[str, Any]:
    doc: dict[str, Any] = _plain(record)
    doc["started"] = round(record.started - origin, 3)
    doc["ended"] = round(record.ended - origin, 3)
    return doc


def _accounts_doc(accounts: Accounts) -> dict[str, Any]:
    doc: dict[str, Any] = _plain(accounts)
    return doc


async def run_chaos(config: RunConfig) -> RunResult:
    """Run one chaos run (see the module docstring)."""
    return await Chaos(config).run()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", choices=("ci", "soak", "custom"), default="ci")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="AT:KIND[:TARGET[:DURATION]]",
        help="a fault of the custom schedule (repeatable), e.g. 10:kill_nats",
    )
    parser.add_argument(
        "--scenario",
        choices=(
            "long-outage",
            "hostile-handler",
            "hostile-payloads",
            "ordering",
            "restore",
            *CLUSTER_CHOICES,
            "pg-failover",
        ),
        help="run one scenario instead (chaos.scenarios, chaos.scenario_ordering,"
        " chaos.scenario_restore, chaos.scenario_cluster for cluster*,"
        " chaos.scenario_pg_failover for pg-failover): small with"
        " --schedule ci, long with --schedule soak",
    )
    parser.add_argument("--seconds", type=float, help="length of the fault phase")
    parser.add_argument("--events", type=int, help="events to commit over the fault phase")
    parser.add_argument("--seed", type=int, help="seed of the plan (default: random, printed)")
    parser.add_argument("--out", type=Path, help="run directory (default: a new one under /tmp)")
    parser.add_argument("--drain-timeout", type=float, help="seconds the drain may take")
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines"
    )
    args = parser.parse_args(argv)
    if bool(args.fault) != (args.schedule == "custom"):
        parser.error("--fault goes with --schedule custom, and custom needs at least one --fault")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**9)
    run_dir = args.out or Path(tempfile.gettempdir()) / "ferry-chaos" / (
        f"{args.scenario or args.schedule}-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=run_dir / "chaos.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config = RunConfig(
        schedule=args.schedule,
        seed=seed,
        seconds=args.seconds,
        events=args.events,
        run_dir=run_dir,
        drain_timeout=args.drain_timeout,
        progress_every=args.progress,
        faults=tuple(args.fault),
    )
    if args.scenario == "pg-failover":
        from chaos.scenario_pg_failover import main_failover  # it imports this module

        return main_failover(config)
    if args.scenario in CLUSTER_CHOICES:
        from chaos.scenario_cluster import main_cluster  # it imports this module

        return main_cluster(config, args.scenario)
    if args.scenario is not None:
        return _main_scenario(config, args.scenario)
    try:
        result = asyncio.run(run_chaos(config))
    except KeyboardInterrupt:
        print(f"interrupted (seed {seed}); logs in {run_dir}", file=sys.stderr)
        return 130
    except FaultSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"chaos run could not be set up (seed {seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print("Fault timeline")
    print(render_timeline(result.timeline))
    print()
    print(result.summary)
    print(f"\nreport: {run_dir}/report.json, summary.txt, timeline.txt, logs/")
    return 0 if result.ok else 1


def _main_scenario(config: RunConfig, scenario: str) -> int:
    """``--scenario``: run it, print its results table; exit 0 when every invariant holds."""
    from chaos.scenario_report import render_table
    from chaos.scenarios import run_scenario  # it imports this module: imported late

    if config.schedule not in ("ci", "soak"):
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_scenario(config, scenario, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"scenario could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(render_table(result))
    print(f"\nreport: {config.run_dir}/scenario.json, scenario.txt, fates.json, logs/")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
