"""What a chaos run is given and what it yields: :class:`RunConfig`, :class:`RunResult`, and
:func:`make_schedule`, which turns a config into the schedule aimed at a world's roles and links.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.accounting import Accounts
from chaos.faults import Timeline
from chaos.schedule import (
    Schedule,
    Targets,
    ci_schedule,
    custom_schedule,
    parse_fault,
    soak_schedule,
)
from chaos.world import World


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
