"""What a run is asked to do: :class:`RunConfig` (the command line's options) and :class:`Size`
(how big a scenario runs, each scenario's defaults overridden by the options)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar


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
    #: The handler-outage scenario's options (None: its own default): the circuit breaker
    #: on or off (``--breaker``), when the outage begins (``--outage-at``, seconds into the
    #: play) and how long it lasts (``--outage``, seconds).
    breaker: bool | None = None
    outage_at: float | None = None
    outage: float | None = None
    echo: Callable[[str], None] = field(default=print, repr=False)


@dataclass(frozen=True)
class Size:
    """How big a scenario runs (a scenario with more knobs extends it)."""

    seconds: float
    events: int
    drain_timeout: float
    rounds: int = 1


SizeT = TypeVar("SizeT", bound=Size)


def sized(size: SizeT, config: RunConfig) -> SizeT:
    """``size`` with the lengths the command line gave (``--seconds``, ``--events``,
    ``--drain-timeout``) in place of its own."""
    return replace(
        size,
        seconds=config.seconds or size.seconds,
        events=config.events or size.events,
        drain_timeout=config.drain_timeout or size.drain_timeout,
    )
