"""The run of a scenario whose events have no fixed fate (issue 22): :class:`ScenarioRun`
starts a tuned world, plays the workload with the scenario's own steps beside it, settles,
drains, and counts every committed event's fate (:mod:`chaos.engine.settled`): processed,
dead-lettered with a reason code or set aside; 0 effects applied twice; 0 unexpected exits
of Ferry's roles; and how long each fault on the timeline held its lanes back
(:mod:`chaos.engine.recovery`, per kind). The results table goes to ``scenario.json`` and
``scenario.txt``.

What a scenario does is its :class:`Play` (``long-outage``, ``hostile-handler``,
``hostile-payloads``, ``ordering``, ``restore``: :mod:`chaos.scenarios`); the run hands
itself to the play, which reaches the world, the ledger and the timeline through it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, ClassVar

import asyncpg

from chaos.engine.config import RunConfig, Size, sized
from chaos.engine.engine import Engine
from chaos.engine.faults import Timeline
from chaos.engine.recovery_table import KindRecovery, recovery_table
from chaos.engine.roles import exit_causes
from chaos.engine.scenario_result import ScenarioResult
from chaos.engine.settled import Settled, count_settled, read_outbox
from chaos.engine.tuning import Tuning
from chaos.engine.workload import Intent, Ledger, Producer
from chaos.engine.world import World

#: Affects every durable (a fault record's ``affects``).
ALL = frozenset({"*"})


class Play:
    """A scenario's own part of a :class:`ScenarioRun`: its world's tuning, its sizes, its
    steps during the workload, and what it adds to the drain and the count. Every hook but
    :attr:`sizes` has a default that does nothing of its own."""

    #: How big the scenario runs, by ``--schedule`` (``ci``, ``soak``).
    sizes: ClassVar[dict[str, Size]]

    def __init__(self, run: ScenarioRun) -> None:
        self.run = run

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """Clocks and settings of the scenario's world."""
        return Tuning()

    def plan(self) -> list[Intent]:
        """The events to commit (called as the play begins)."""
        return self.run.engine.workload(self.run.size.events, self.run.size.seconds)()

    def producer(self, context: str, intents: list[Intent]) -> Producer:
        """The producer of one context's planned events."""
        return self.run.engine.producer(context, intents)

    async def before(self) -> None:
        """Steps before the workload starts."""

    async def during(self, begin: float) -> None:
        """The scenario's own steps while the workload runs (from ``begin``)."""

    async def settle(self) -> None:
        """Bring the world back after the play (see :meth:`Engine.settle`)."""
        await self.run.engine.settle()

    async def after_drain(self) -> bool:
        """Steps once drained (an operator's); True when the run must drain again."""
        return False

    async def outstanding(self) -> list[str]:
        """What else the drain waits for."""
        return []

    def measured(self, intents: list[Intent]) -> list[Intent]:
        """The events whose waits measure the faults' recovery (all of them by default;
        a play leaves out those that wait on purpose)."""
        return intents

    async def count_more(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        """The scenario's own rows of the table and broken invariants."""
        return {}, []

    def after_stop(self, settled: Settled) -> list[str]:
        """Once the world is down: dead letters nothing explains."""
        return []


class ScenarioRun:
    """One scenario: a tuned world, its play, the drain, the count."""

    def __init__(
        self, config: RunConfig, name: str, play: type[Play], size_name: str = "ci"
    ) -> None:
        self.config, self.name, self.size_name = config, name, size_name
        self.size = sized(play.sizes[size_name], config)
        self.engine = Engine(config, World(config.run_dir, config.seed, play.tuning(config)))
        self.must_process: set[str] = set()
        self.faults: Counter[str] = Counter()
        self.notes: list[str] = []
        self.play = play(self)

    @property
    def world(self) -> World:
        """The scenario's world."""
        return self.engine.world

    @property
    def ledger(self) -> Ledger:
        """The intent ledger."""
        return self.engine.ledger

    @property
    def timeline(self) -> Timeline:
        """The fault timeline."""
        return self.engine.timeline

    async def run(self) -> ScenarioResult:
        """Start, play, settle, drain, count; always tear the world down."""
        started = time.monotonic()
        engine, play = self.engine, self.play
        async with engine.session(
            f"scenario {self.name} ({self.size_name}), seed {self.config.seed}"
        ):
            await engine.roles_ready()
            await play.before()
            await engine.play(play.plan, self.size.seconds, play.during, producer=play.producer)
            await play.settle()
            await engine.connect([self.world.nats_server().url], "chaos-accounting")
            drain = await self._drain()
            if drain is not None and await play.after_drain():
                drain = await self._drain()
            settled = await count_settled(
                self.world.topo, engine.dsns(), self.ledger, self.must_process
            )
            extra, extra_violations = await play.count_more(settled)
            recovery = await self._recovery()
        unexplained = play.after_stop(settled)
        ferry_roles = [r for r in self.world.roles.values() if r.kind != "front"]
        return ScenarioResult(
            name=self.name,
            size=self.size_name,
            seed=self.config.seed,
            settled=settled,
            faults=self.faults,
            unexpected_exits=engine.unexpected_exits(ferry_roles),
            exit_causes=exit_causes(ferry_roles),
            restarts=engine.restarts(),
            drained=drain is not None,
            drain_seconds=drain,
            duration=time.monotonic() - started,
            run_dir=self.config.run_dir,
            notes=self.notes + [t for _, t in self.timeline.events],
            without_cause=unexplained,
            extra=extra,
            extra_violations=extra_violations,
            recovery=recovery,
        )

    async def _recovery(self) -> dict[str, KindRecovery]:
        """Per fault kind on the timeline, its recovery (the inboxes are read only when
        there is a fault to measure)."""
        records = self.timeline.records
        if not records:
            return {}
        intents = self.play.measured(list(self.engine.ledger.intents.values()))
        figures, _ = await self.engine.recoveries(
            records, tolerate_unreachable=True, intents=intents
        )
        return recovery_table(records, figures)

    # -- the drain ----------------------------------------------------------------------

    async def _drain(self) -> float | None:
        await self.engine.resolve_uncertain()
        return await self.engine.wait_drained(
            self._outstanding,
            self.size.drain_timeout,
            line="drain t+{:4.0f}s waiting for: {}",
            tell_last=True,
        )

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
        return waiting + await self.engine.consumers_waiting() + await self.play.outstanding()

    async def _unsettled(self, outbox: dict[str, dict[str, Any]]) -> list[str]:
        published: dict[str, list[str]] = {}
        for intent in self.ledger.intents.values():
            row = outbox.get(intent.id)
            if row is not None and row["published"]:
                published.setdefault(intent.durable, []).append(intent.id)
        return await self.engine.unsettled(
            published,
            "SELECT count(DISTINCT i) FROM unnest($2::uuid[]) AS i WHERE"
            " EXISTS (SELECT 1 FROM dead_letters d WHERE d.durable = $1"
            "         AND d.message_id = i)"
            " OR EXISTS (SELECT 1 FROM inbox_messages m WHERE m.durable = $1"
            "         AND m.message_id = i AND m.status = 'processed')",
        )
