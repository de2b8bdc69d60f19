"""The ordinary chaos run: ``python -m chaos.run [--schedule ci|soak|custom] [--seconds N]
[--seed S]``.

1. start a world of its own (:mod:`chaos.engine.world`): PostgreSQL, nats-server, a
   Toxiproxy, and every role of sea-vibespro behind proxies;
2. for the schedule's duration, commit the planned events (:mod:`chaos.engine.workload`)
   while injecting the planned faults (:mod:`chaos.engine.faults`), restarting any role that
   dies by itself (and recording it), printing progress;
3. remove every toxic, make sure every server and role is up, and wait for the drain:
   every committed event settled, every JetStream consumer idle;
4. count everything (:mod:`chaos.engine.accounting`) and how long each fault held its
   lanes back (:mod:`chaos.engine.recovery`, per kind); the fault timeline and the summary
   (:mod:`chaos.scenarios.fault_schedule.result`) are printed and written (``report.json``,
   ``summary.txt``, ``timeline.txt``) to the run directory.

:class:`ScheduleRun` is handed an :class:`~chaos.engine.engine.Engine` on the ordinary world;
:func:`make_schedule` turns the command line into the schedule aimed at that world.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from chaos.engine.config import RunConfig
from chaos.engine.engine import Engine, sleep_until
from chaos.engine.faults import FaultInjector
from chaos.engine.recovery_table import recovery_table
from chaos.engine.schedule import (
    Schedule,
    Targets,
    ci_schedule,
    custom_schedule,
    parse_fault,
    soak_schedule,
)
from chaos.engine.world import World
from chaos.scenarios.fault_schedule.result import RunResult, render_summary

#: Seconds the producers may run past the fault phase to commit what outages delayed.
PRODUCER_GRACE = 60.0


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


class ScheduleRun:
    """One run, from the world's start to the result."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.engine = Engine(config, World(config.run_dir, config.seed))

    async def run(self) -> RunResult:
        """Set up, inject, drain, count; always tear the world down."""
        started = time.monotonic()
        config, engine, world = self.config, self.engine, self.engine.world
        async with engine.session(
            f"chaos run: schedule {config.schedule}, seed {config.seed}",
            f"run directory: {config.run_dir}",
        ):
            schedule = make_schedule(config, world)
            self._print_plan(schedule)
            injector = FaultInjector(world, engine.timeline, config.seed)

            async def faults(begin: float) -> None:
                await self._run_faults(schedule, injector, begin)

            def progress(elapsed: float, counts: str) -> str:
                return (
                    f"t+{elapsed:5.0f}s  committed {engine.ledger.count('committed'):>6}/"
                    f"{schedule.events}  {counts}  faults {len(engine.timeline.records)}"
                )

            fault_seconds = await engine.play(
                engine.workload(schedule.events, schedule.seconds),
                schedule.seconds,
                faults,
                progress=progress,
                grace=PRODUCER_GRACE,
            )
            await engine.settle()
            await engine.connect([world.nats_server().url], "chaos-accounting")
            drain = await engine.drain(schedule.drain_timeout)
            accounts = await engine.count()
            records = engine.timeline.records
            figures, _ = await engine.recoveries(records, tolerate_unreachable=True)
            for record, figure in zip(records, figures, strict=True):
                record.recovery = figure  # per fault on the timeline and in report.json
        result = RunResult(
            seed=config.seed,
            schedule=schedule,
            accounts=accounts,
            timeline=engine.timeline,
            duration=time.monotonic() - started,
            fault_seconds=fault_seconds,
            drain_seconds=drain,
            drained=drain is not None,
            restarts=engine.restarts(),
            unexpected_exits=engine.unexpected_exits(),
            producer={
                "transactions": sum(p.transactions for p in engine.producers),
                "reconnects": sum(p.reconnects for p in engine.producers),
                "errors": dict(engine.ledger.errors),
            },
            run_dir=config.run_dir,
            recovery=recovery_table(records, figures),
        )
        result.summary = render_summary(result)
        return result

    def _print_plan(self, schedule: Schedule) -> None:
        echo = self.engine.echo
        echo(
            f"plan: {schedule.events} events over {schedule.seconds:.0f}s, "
            f"{len(schedule.faults)} faults"
            + (f", {schedule.quiet_periods} quiet periods" if schedule.quiet_periods else "")
        )
        if len(schedule.faults) <= 40:
            for fault in schedule.faults:
                echo("  " + fault.describe())

    async def _run_faults(self, schedule: Schedule, injector: FaultInjector, begin: float) -> None:
        tasks = []
        for planned in schedule.faults:
            await sleep_until(begin + planned.at)
            tasks.append(asyncio.create_task(injector.inject(planned)))
        await sleep_until(begin + schedule.seconds)
        await asyncio.gather(*tasks)
