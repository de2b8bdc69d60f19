"""The handler outage (issue 45): ``python -m chaos.run --scenario handler-outage
[--breaker on|off] [--seconds N --events M --outage-at T --outage S] [--schedule ci|soak]``.

The world is the ordinary run's (:mod:`chaos.engine.world`) with the shipped clocks
(:func:`~chaos.scenarios.handler_outage.plan.tuning`: ``vibespro__from_sea`` keeps its
ack_wait 120 s, max_deliver 20, back-off 1/5/30/120/600 s and handler timeout 10 s; replay
is left to the operator so dead letters stay put) and the lane's circuit breaker on or off.
The play commits SEA events of class normal at an even rate
(:mod:`~chaos.scenarios.handler_outage.workload`); at ``outage_at`` the consumer's handler
link goes down (Toxiproxy ``link_down``: connections closed, new ones refused) for
``outage`` seconds, then comes back; then the drain. No other fault.

The count: the ordinary invariants (:mod:`chaos.engine.accounting`), and the outage's
figures (:mod:`~chaos.scenarios.handler_outage.figures`) from the lane's inbox, effects
ledger and dead letters and the consumer's breaker lines, against the intent ledger. The
verdict (:mod:`~chaos.scenarios.handler_outage.result`): 0 lost and 0 applied twice always
gate; breaker on, the issue's targets too (resume within 5 s, the backlog of an outage up
to 3 minutes drained within 30 s, 0 dead letters, no event past its 2nd delivery but by
the probes); breaker off is the comparison arm, its dead letters are figures.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from chaos.engine import db
from chaos.engine.config import RunConfig
from chaos.engine.engine import Engine, sleep_until
from chaos.engine.faults import FaultInjector, FaultRecord
from chaos.engine.results import render_rows
from chaos.engine.schedule import PlannedFault
from chaos.engine.world import World
from chaos.scenarios.handler_outage.figures import (
    Dump,
    InboxRow,
    breaker_lines,
    failure_times,
    outage_figures,
)
from chaos.scenarios.handler_outage.plan import CONSUMER, DURABLE, SCENARIO, outage_size, tuning
from chaos.scenarios.handler_outage.result import OutageResult
from chaos.scenarios.handler_outage.workload import lane_workload


class HandlerOutageRun:
    """The scenario (see the module docstring)."""

    def __init__(self, config: RunConfig, size_name: str = "ci") -> None:
        self.config, self.size_name = config, size_name
        self.size = outage_size(config, size_name)
        self.engine = Engine(config, World(config.run_dir, config.seed, tuning(self.size.breaker)))
        self.outage: FaultRecord | None = None

    async def run(self) -> OutageResult:
        """Start, play (the outage within), settle, drain, count; always tear down."""
        started = time.monotonic()
        engine, size = self.engine, self.size
        async with engine.session(
            f"scenario {SCENARIO} ({self.size_name}), seed {self.config.seed},"
            f" breaker {'on' if size.breaker else 'off'}",
            f"  {size.events} events over {size.seconds:g}s, the handler down from"
            f" t+{size.outage_at:g}s for {size.outage:g}s",
            f"run directory: {self.config.run_dir}",
        ):
            await engine.roles_ready()
            await engine.play(lane_workload(engine, size), size.seconds, self._outage)
            await engine.settle()
            await engine.connect([engine.world.nats_server().url], "chaos-handler-outage")
            drain = await engine.drain(size.drain_timeout)
            # The figures first, and said at once: the ordinary count reads the whole
            # stream back, long after a long run's figures are known.
            dump = await self._dump()
            figures = None if dump is None else outage_figures(dump)
            if figures is not None:
                engine.echo("figures (before the ordinary count):")
                for line in render_rows(figures.doc(), (), width=50):
                    engine.echo(line)
            accounts = await engine.count()
        record = self.outage
        return OutageResult(
            size=self.size_name,
            seed=self.config.seed,
            accounts=accounts,
            breaker=size.breaker,
            events_planned=size.events,
            seconds=size.seconds,
            outage_at=size.outage_at,
            outage=size.outage,
            outage_ok=record is not None and record.ok and record.restored > 0,
            outage_detail="" if record is None else record.detail,
            figures=figures,
            **engine.outcome(started, drain),
        )

    async def _outage(self, begin: float) -> None:
        """The handler's link down at ``outage_at`` for ``outage`` seconds."""
        await sleep_until(begin + self.size.outage_at)
        link = next(
            link
            for link in self.engine.world.links.values()
            if link.role == CONSUMER and link.kind == "handler"
        )
        injector = FaultInjector(self.engine.world, self.engine.timeline, self.config.seed)
        planned = PlannedFault(self.size.outage_at, "link_down", link.name, self.size.outage)
        self.engine.echo(f"outage: {planned.describe()}")
        self.outage = await injector.inject(planned)
        self.engine.echo(f"handler back: {self.outage.line(self.engine.timeline.origin)}")

    async def _dump(self) -> Dump | None:
        """What the figures are computed from (None when the outage never happened)."""
        record = self.outage
        if record is None or not record.restored:
            return None
        world = self.engine.world
        dsn = world.direct_dsn(world.topo.durables[DURABLE].target)
        handler = world.topo.durables[DURABLE].target
        inbox = await db.fetch(
            dsn,
            "SELECT message_id::text AS id, status, attempts, retry_history::text AS history"
            " FROM inbox_messages WHERE durable = $1",
            DURABLE,
        )
        applied = await db.fetch(
            dsn,
            "SELECT message_id::text AS id, extract(epoch FROM applied_at)::float8 AS at"
            " FROM handler_applied WHERE handler = $1",
            handler,
        )
        ok_calls = await db.fetch(
            dsn,
            "SELECT message_id::text AS id, count(*) AS n FROM handler_calls"
            " WHERE handler = $1 AND status = 200 GROUP BY message_id",
            handler,
        )
        dead = await db.fetch(
            dsn,
            "SELECT message_id::text AS id, reason_code FROM dead_letters WHERE durable = $1",
            DURABLE,
        )
        log_path = world.roles[CONSUMER].log_path
        lines = await asyncio.to_thread(log_path.read_text, errors="replace")
        return Dump(
            committed={
                i.id: i.committed_at
                for i in self.engine.ledger.by_status("committed")
                if i.durable == DURABLE
            },
            inbox={
                r["id"]: InboxRow(r["status"], r["attempts"], failure_times(r["history"]))
                for r in inbox
            },
            applied={r["id"]: r["at"] for r in applied},
            ok_calls=Counter({r["id"]: int(r["n"]) for r in ok_calls}),
            dead={r["id"]: r["reason_code"] for r in dead},
            breaker=breaker_lines(lines.splitlines()),
            down=record.started,
            back=record.restored,
        )
