"""The handler outage's plan (:mod:`chaos.scenarios.handler_outage`): its ``--scenario`` name,
the lane it hits, how big it runs (:data:`SIZES`, overridden by the command line), the
world's tuning, and the issue's targets."""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaos.engine.config import RunConfig, Size, sized
from chaos.engine.tuning import Tuning

#: The ``--scenario`` name.
SCENARIO = "handler-outage"
#: The lane: SEA's events, read by this durable, handled by VibesPro's handler.
SOURCE = "sea"
DURABLE = "vibespro__from_sea"
#: The consumer whose handler link goes down (its log has the breaker's lines).
CONSUMER = f"consumer-{DURABLE}"
#: The handler timeout the shipped topology gives the durable.
HANDLER_TIMEOUT = "10s"

#: Breaker on: the first event applied at most this long after the handler's return (s).
RESUME_TARGET = 5.0
#: Breaker on: the backlog drained at most this long after the return (s), for an outage
#: up to :data:`DRAIN_TARGET_UP_TO` (the issue's 3 minutes at 20 events/s).
DRAIN_TARGET = 30.0
DRAIN_TARGET_UP_TO = 180.0


@dataclass(frozen=True)
class OutageSize(Size):
    """How big the scenario runs: ``events`` over ``seconds``, the handler down from
    ``outage_at`` for ``outage`` seconds."""

    outage_at: float = 10.0
    outage: float = 20.0
    breaker: bool = True


#: ``ci``: the test's size, a 20 s outage at 10 events/s. ``soak``: the issue's long one,
#: 30 minutes at 100 events/s. The issue's 3-minute outage at 20 events/s is
#: ``--seconds 240 --events 4800 --outage-at 20 --outage 180``.
SIZES: dict[str, OutageSize] = {
    "ci": OutageSize(40.0, 400, 300.0, outage_at=8.0, outage=20.0),
    "soak": OutageSize(1920.0, 192_000, 1200.0, outage_at=60.0, outage=1800.0),
}
#: Breaker off, the drain waits out the back-off ladder's longest step (the shipped 600 s)
#: on top of the size's drain timeout, unless ``--drain-timeout`` says otherwise.
LADDER_TOP = 600.0


def outage_size(config: RunConfig, size_name: str) -> OutageSize:
    """The size of ``size_name`` with what the command line gave in place of its own."""
    size = sized(SIZES[size_name], config)
    breaker = size.breaker if config.breaker is None else config.breaker
    drain = size.drain_timeout
    if not breaker and config.drain_timeout is None:
        drain += LADDER_TOP
    size = replace(
        size,
        outage_at=size.outage_at if config.outage_at is None else config.outage_at,
        outage=size.outage if config.outage is None else config.outage,
        breaker=breaker,
        drain_timeout=drain,
    )
    if size.outage <= 0 or size.outage_at < 0 or size.outage_at + size.outage > size.seconds:
        raise ValueError(
            f"the outage ({size.outage:g}s from t+{size.outage_at:g}s) must lie within the"
            f" {size.seconds:g}s of the play"
        )
    return size


def tuning(breaker: bool) -> Tuning:
    """The shipped clocks (every durable keeps its own ack_wait, max_deliver and back-off;
    the handler timeout its own), replay left to the operator so dead letters stay put,
    and the lane's breaker on or off."""
    return Tuning(
        clocks={"replay": "operator"},
        handler_timeout=HANDLER_TIMEOUT,
        durables={DURABLE: {"circuit_breaker": {"enabled": breaker}}},
    )
