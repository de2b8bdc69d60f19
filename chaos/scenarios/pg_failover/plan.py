"""The failover drill's plan (:mod:`chaos.scenarios.pg_failover`): its ``--scenario`` name,
how big it runs (:data:`SIZES`) and when in the fault phase each failover happens."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.engine.config import Size

#: The ``--scenario`` name.
SCENARIO = "pg-failover"


@dataclass(frozen=True)
class FailoverSize(Size):
    """How big the drill runs."""

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
