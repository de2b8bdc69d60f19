"""The outage's workload: SEA's events only, every one of class ``normal`` (no directive: the
handler fails none of them on purpose), evenly over the play — so every delivery past an
event's first is the outage's doing, and each must end applied once.

The plan is the ordinary workload's (:func:`chaos.engine.workload.plan_events`) narrowed to
the lane's source context and one class.
"""

from __future__ import annotations

from collections.abc import Callable

from chaos.engine.engine import Engine
from chaos.engine.workload import Intent
from chaos.scenarios.handler_outage.plan import DURABLE, SOURCE, OutageSize

#: The one class of the workload.
CLASS = "normal"


def lane_workload(engine: Engine, size: OutageSize) -> Callable[[], list[Intent]]:
    """The plan: ``size.events`` SEA events of class normal over ``size.seconds``."""
    plan = engine.workload(size.events, size.seconds, context=SOURCE, only=CLASS)

    def planned() -> list[Intent]:
        intents = plan()
        astray = {i.durable for i in intents} - {DURABLE}
        if astray:
            raise ValueError(f"the workload reaches durables besides {DURABLE}: {astray}")
        return intents

    return planned
