"""Three scenarios past the ordinary fault envelope (ISSUE 22), each small in CI and long
in the soak (``python -m chaos.run --scenario NAME [--schedule soak]``):

``long-outage``       every role's NATS link down; then NATS silent (PubAcks later than
                      the publish timeout) so outbox rows fail attempt after attempt, and,
                      compressed in time, get as many attempts as a 40-minute outage
                      leaves (``outbox_fast_forward``, past every attempt cap); then one
                      consumer's handler link down long enough that every delivery of
                      the messages arriving meanwhile is spent. Rows set aside
                      PUBLISH_REFUSED are republished by the operator afterwards.
``hostile-handler``   a hostile front (:mod:`chaos.hostile_handler`) before each handler:
                      random 401/403/408/413/429/5xx, Retry-After of every kind,
                      non-UTF-8 and huge bodies, trickled answers, resets mid-body.
``hostile-payloads``  plain-SQL INSERTs (:mod:`chaos.hostile_payloads`) at and around
                      every size limit, deep nesting, huge numbers, NUL bytes, lone
                      surrogates, beside an ordinary workload.
``ordering``          ``ordering: key`` durables (hold and skip) on partitioned streams,
                      a replica set that grows and shrinks, kills, a NATS restart, held
                      heads replayed or discarded by the operator; per key, the applied
                      order against the commit order (:mod:`chaos.scenario_ordering`).
``restore``           a restore drill: a context's database backed up while the workload
                      runs, restored later (everything after the backup forgotten), the
                      durables targeting it rewound, the restored outbox re-publishing
                      (:mod:`chaos.scenario_restore`).

Afterwards (:mod:`chaos.scenario_accounting`): every committed event processed,
dead-lettered with a reason code or set aside; 0 effects applied twice; 0 unexpected
exits of Ferry's roles. The results table goes to ``scenario.json`` and ``scenario.txt``
in the run directory.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg

from chaos import hostile_payloads
from chaos.run import Chaos, RunConfig
from chaos.scenario_accounting import Settled, count_settled, read_outbox
from chaos.scenario_faults import (
    SILENT_NATS,
    LinksDown,
    Toxic,
    count_hostile_answers,
    dead_letters_without_cause,
    exit_causes,
    fast_forward,
    operator_republish,
    wait_for_failing_rows,
)
from chaos.scenario_report import ScenarioResult, write_scenario_report
from chaos.workload import Intent, Producer, plan_events
from chaos.world import DURABLE_CLOCKS, Tuning, World

#: Scenario names (the ``--scenario`` choices); ``ordering`` is :mod:`chaos.scenario_ordering`,
#: ``restore`` :mod:`chaos.scenario_restore`.
SCENARIOS = ("long-outage", "hostile-handler", "hostile-payloads", "ordering", "restore")
#: The durable whose handler the long outage takes away.
OUTAGE_DURABLE = "vibespro__from_sea"
#: Affects every durable (a fault record's ``affects``).
ALL = frozenset({"*"})
#: Settings that compress the publisher's clocks: its own back-off, its PubAck timeout and
#: the attempt cap past which a row is set aside.
PUBLISHER_COMPRESSED = {
    "FERRY_RETRY_INITIAL": "0.05",
    "FERRY_RETRY_MAX": "0.3",
    "FERRY_PUBLISH_TIMEOUT": "1",
    "FERRY_MAX_PUBLISH_ATTEMPTS": "8",
}


@dataclass(frozen=True)
class Size:
    """How big a scenario runs."""

    seconds: float
    events: int
    drain_timeout: float
    rounds: int = 1


SIZES: dict[str, dict[str, Size]] = {
    "ci": {
        "long-outage": Size(40.0, 240, 120.0),
        "hostile-handler": Size(35.0, 300, 75.0),
        "hostile-payloads": Size(25.0, 120, 75.0),
        "ordering": Size(60.0, 480, 150.0),
        "restore": Size(45.0, 450, 120.0),
    },
    "soak": {
        "long-outage": Size(600.0, 20_000, 400.0),
        "hostile-handler": Size(600.0, 20_000, 400.0),
        "hostile-payloads": Size(300.0, 5_000, 400.0, rounds=5),
        "ordering": Size(600.0, 12_000, 400.0, rounds=10),
        "restore": Size(600.0, 12_000, 400.0),
    },
}


class ScenarioRun(Chaos):
    """One scenario: a tuned world, its play, the drain, the count."""

    def __init__(self, config: RunConfig, scenario: str, size_name: str = "ci") -> None:
        super().__init__(config)
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r} ({', '.join(SCENARIOS)})")
        self.scenario, self.size_name = scenario, size_name
        size = SIZES[size_name][scenario]
        self.size = replace(
            size,
            seconds=config.seconds or size.seconds,
            events=config.events or size.events,
            drain_timeout=config.drain_timeout or size.drain_timeout,
        )
        self.world = World(config.run_dir, config.seed, self.tuning())
        self.must_process: set[str] = set()
        self.faults: Counter[str] = Counter()
        self.notes: list[str] = []

    # -- the world of each scenario -----------------------------------------------------

    def tuning(self) -> Tuning:
        """Clocks and settings of the scenario's world."""
        if self.scenario == "long-outage":
            clocks = {
                "ack_wait": "3s",
                "max_deliver": 4,
                "backoff": ["200ms", "500ms", "1s"],
                "replay": "operator",
            }
            return Tuning(
                clocks=clocks,
                handler_timeout="2s",
                settings={"publisher": dict(PUBLISHER_COMPRESSED)},
            )
        if self.scenario == "hostile-handler":
            clocks = {
                "ack_wait": "6s",
                "max_deliver": 10,
                "backoff": ["200ms", "500ms", "1s", "2s"],
                "replay": "operator",
            }
            fronts = {
                d: [
                    "-m",
                    "chaos.hostile_handler",
                    "--seed",
                    str(self.config.seed),
                    "--log",
                    str(self.hostile_log(d)),
                ]
                for d in ("sea__from_vibespro", "vibespro__from_sea")
            }
            consumer = {
                "FERRY_RETRY_AFTER_CAP": "2",
                "FERRY_AUTH_RETRY_INITIAL": "0.2",
                "FERRY_AUTH_RETRY_MAX": "1",
            }
            return Tuning(clocks=clocks, settings={"consumer": consumer}, fronts=fronts)
        return Tuning(
            clocks=dict(DURABLE_CLOCKS), settings={"publisher": dict(PUBLISHER_COMPRESSED)}
        )

    def hostile_log(self, durable: str) -> Path:
        """Where the hostile front of ``durable`` logs its answers."""
        return self.config.run_dir / f"hostile-{durable}.jsonl"

    # -- the run ------------------------------------------------------------------------

    async def run_scenario(self) -> ScenarioResult:
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
            await self._roles_ready()
            await self._play()
            await self._settle_world()
            drain = await self._scenario_drain()
            # The operator's part: rows the outage set aside are republished (audited).
            outage = drain is not None and self.scenario == "long-outage"
            if outage and await operator_republish(self.world, self.timeline, self.faults):
                drain = await self._scenario_drain()
            settled = await count_settled(
                self.world.topo,
                {c: self.world.direct_dsn(c) for c in self.world.topo.contexts},
                self.ledger,
                self.must_process,
            )
            extra, extra_violations = await self._count_more(settled)
        finally:
            self.stopping.set()
            await asyncio.gather(monitor, return_exceptions=True)
            if self.nc is not None:
                await self.nc.close()
            await self.world.stop()
        logs = {d: self.hostile_log(d) for d in sorted(self.world.tuning.fronts)}
        count_hostile_answers(list(logs.values()), self.faults)
        unexplained = dead_letters_without_cause(self.world, logs, self.ledger, settled)
        ferry_roles = [r for r in self.world.roles.values() if r.kind != "front"]
        result = ScenarioResult(
            name=self.scenario,
            size=self.size_name,
            seed=self.config.seed,
            settled=settled,
            faults=self.faults,
            unexpected_exits=[
                f"{e.role} exited with {e.code} at t+{e.at - self.timeline.origin:.1f}s"
                for r in ferry_roles
                for e in r.unexpected
            ],
            exit_causes=exit_causes(ferry_roles),
            restarts={r.name: r.starts - 1 for r in self.world.roles.values()},
            drained=drain is not None,
            drain_seconds=drain,
            duration=time.monotonic() - started,
            run_dir=self.config.run_dir,
            notes=self.notes + [t for _, t in self.timeline.events],
            without_cause=unexplained,
            extra=extra,
            extra_violations=extra_violations,
        )
        write_scenario_report(result)
        return result

    async def _count_more(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        """A scenario's own rows of the table and broken invariants (none here)."""
        return {}, []

    async def _play(self) -> None:
        begin = time.monotonic()
        self.timeline.origin = time.time()
        stop = asyncio.Event()
        intents = plan_events(
            self.world.topo, self.config.seed, self.size.events, self.size.seconds
        )
        contexts = sorted({i.context for i in intents})
        self.producers = [self._producer(c, intents) for c in contexts]
        producing = [asyncio.create_task(p.run(begin, stop)) for p in self.producers]
        progress = asyncio.create_task(self._progress_lines(begin))
        try:
            await self._during_play(begin)
            rest = begin + self.size.seconds - time.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)
            _, late = await asyncio.wait(producing, timeout=30)
            if late:
                self.timeline.note(f"{len(late)} producer(s) late; stopped")
            stop.set()
            await asyncio.gather(*producing)
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)

    def _producer(self, context: str, intents: list[Intent]) -> Producer:
        """The producer of one context's planned events."""
        return Producer(context, self.world.direct_dsn(context), intents, self.ledger)

    async def _during_play(self, begin: float) -> None:
        """The scenario's own steps while the workload runs (from ``begin``)."""
        if self.scenario == "long-outage":
            await self._long_outage(begin)
        elif self.scenario == "hostile-payloads":
            await self._hostile_payloads()

    async def _progress_lines(self, begin: float) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)
            counts = await self._db_counts()
            self.echo(
                f"t+{time.monotonic() - begin:5.0f}s  committed "
                f"{self.ledger.count('committed')}  {counts}"
            )

    # -- long outage --------------------------------------------------------------------

    async def _long_outage(self, begin: float) -> None:
        seconds, world, timeline, faults = self.size.seconds, self.world, self.timeline, self.faults
        await _sleep_until(begin + 0.10 * seconds)
        nats_links = [link.name for link in world.links_of("nats")]
        async with LinksDown(world, timeline, faults, "nats_outage", nats_links, ALL):
            await asyncio.sleep(0.25 * seconds)
        # JetStream silent: connected, but every PubAck comes after the publish timeout,
        # so each attempt fails and counts; then time is compressed (fast-forward).
        publishers = [f"{role.name}_nats" for role in world.roles_of("publisher")]
        async with Toxic(world, timeline, faults, "nats_silent", publishers, SILENT_NATS):
            await wait_for_failing_rows(world, timeout=0.20 * seconds)
            await fast_forward(world, timeline, faults)
            await asyncio.sleep(0.05 * seconds)
        await _sleep_until(begin + 0.62 * seconds)
        link = f"consumer-{OUTAGE_DURABLE}_handler"
        affects = frozenset({OUTAGE_DURABLE})
        async with LinksDown(world, timeline, faults, "handler_outage", [link], affects):
            await asyncio.sleep(0.25 * seconds)

    # -- hostile payloads ---------------------------------------------------------------

    async def _hostile_payloads(self) -> None:
        cases = hostile_payloads.catalogue(rounds=self.size.rounds)
        cases += hostile_payloads.train(followers=105)
        outcomes = await hostile_payloads.insert_all(
            self.world.direct_dsn(hostile_payloads.CONTEXT), cases, self.ledger, self.config.seed
        )
        for outcome in outcomes:
            family = outcome.case.name.split("#")[0]
            family = "train-follower" if family.startswith("train-follower") else family
            self.faults[f"payload {family}"] += 1
            if outcome.refused:
                why = " ".join(outcome.refused.split())
                self.notes.append(f"refused at the source: {outcome.case.name}: {why}")
            elif outcome.case.expect == "processed":
                self.must_process.add(outcome.intent.id)

    # -- the drain ----------------------------------------------------------------------

    async def _scenario_drain(self) -> float | None:
        await self._resolve_uncertain()
        begin, last_print, quiet_since = time.monotonic(), 0.0, None
        while time.monotonic() - begin < self.size.drain_timeout:
            waiting = await self._outstanding()
            now = time.monotonic()
            if not waiting:
                quiet_since = quiet_since or now
                if now - quiet_since >= 3.0:
                    self.echo(f"drained in {now - begin - 3.0:.1f}s")
                    return now - begin - 3.0
            else:
                quiet_since = None
                if now - last_print >= self.config.progress_every:
                    self.echo(f"drain t+{now - begin:4.0f}s waiting for: {'; '.join(waiting)}")
                    last_print = now
            await asyncio.sleep(0.5)
        self.echo(f"NOT drained after {self.size.drain_timeout:.0f}s: {'; '.join(waiting)}")
        return None

    async def _outstanding(self) -> list[str]:
        """What is not settled yet (set-aside rows and rows held behind them are)."""
        topo, waiting = self.world.topo, []
        outbox: dict[str, dict[str, Any]] = {}
        try:
            for context, spec in sorted(topo.contexts.items()):
                if spec.stream is not None:
                    outbox.update(await read_outbox(self.world.direct_dsn(context)))
            pending = [
                i
                for i, r in outbox.items()
                if not r["published"] and not r["set_aside"] and not r["held"]
            ]
            if pending:
                waiting.append(f"{len(pending)} unpublished")
            waiting += await self._unsettled(outbox)
        except (OSError, asyncpg.PostgresError) as exc:
            return [f"database: {exc}"]
        return waiting + await self._consumers_waiting()

    async def _unsettled(self, outbox: dict[str, dict[str, Any]]) -> list[str]:
        published: dict[str, list[str]] = {}
        for intent in self.ledger.intents.values():
            row = outbox.get(intent.id)
            if row is not None and row["published"]:
                published.setdefault(intent.durable, []).append(intent.id)
        out = []
        for durable, ids in sorted(published.items()):
            target = self.world.topo.durables[durable].target
            conn = await asyncpg.connect(self.world.direct_dsn(target), timeout=5)
            try:
                settled = await conn.fetchval(
                    "SELECT count(DISTINCT i) FROM unnest($2::uuid[]) AS i WHERE"
                    " EXISTS (SELECT 1 FROM dead_letters d WHERE d.durable = $1"
                    "         AND d.message_id = i)"
                    " OR EXISTS (SELECT 1 FROM inbox_messages m WHERE m.durable = $1"
                    "         AND m.message_id = i AND m.status = 'processed')",
                    durable,
                    ids,
                )
            finally:
                await conn.close()
            if settled < len(ids):
                out.append(f"{durable}: {len(ids) - settled} of {len(ids)} unsettled")
        return out


async def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_scenario(config: RunConfig, scenario: str, size: str = "ci") -> ScenarioResult:
    """Run one scenario (see the module docstring)."""
    if scenario == "ordering":
        from chaos.scenario_ordering import OrderingRun  # it imports this module

        return await OrderingRun(config, scenario, size).run_scenario()
    if scenario == "restore":
        from chaos.scenario_restore import RestoreRun  # it imports this module

        return await RestoreRun(config, scenario, size).run_scenario()
    return await ScenarioRun(config, scenario, size).run_scenario()
