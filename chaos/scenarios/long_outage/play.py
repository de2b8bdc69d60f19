"""The ``long-outage`` scenario (ISSUE 22): ``python -m chaos.run --scenario long-outage
[--schedule soak]``.

Every role's NATS link down; then NATS silent (PubAcks later than the publish timeout) so
outbox rows fail attempt after attempt, and, compressed in time, get as many attempts as a
40-minute outage leaves (``outbox_fast_forward``, past every attempt cap); then one
consumer's handler link down long enough that every delivery of the messages arriving
meanwhile is spent. Rows set aside PUBLISH_REFUSED are republished by the operator
afterwards (:mod:`chaos.scenarios.long_outage.steps`).
"""

from __future__ import annotations

import asyncio

from chaos.engine.config import RunConfig, Size
from chaos.engine.engine import sleep_until
from chaos.engine.scenario import ALL, Play
from chaos.engine.tuning import PUBLISHER_COMPRESSED, Tuning, short_clocks
from chaos.scenarios.long_outage.steps import (
    SILENT_NATS,
    fast_forward,
    links_down,
    operator_republish,
    toxic_on,
    wait_for_failing_rows,
)

#: The durable whose handler the long outage takes away.
OUTAGE_DURABLE = "vibespro__from_sea"


class LongOutage(Play):
    """The long outage (see the module docstring)."""

    sizes = {"ci": Size(40.0, 240, 120.0), "soak": Size(600.0, 20_000, 400.0)}

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """Short durable clocks, a short handler timeout, the publisher compressed."""
        return Tuning(
            clocks=short_clocks("3s", 4, ["200ms", "500ms", "1s"]),
            handler_timeout="2s",
            settings={"publisher": dict(PUBLISHER_COMPRESSED)},
            # The handler outage is here to spend every delivery (dead letters, then the
            # operator's replay); the circuit breaker, on by default, would hold them.
            durables={OUTAGE_DURABLE: {"circuit_breaker": {"enabled": False}}},
        )

    async def during(self, begin: float) -> None:
        """NATS away, NATS silent (and time fast-forwarded), a handler away."""
        run = self.run
        seconds, world = run.size.seconds, run.world
        await sleep_until(begin + 0.10 * seconds)
        nats_links = [link.name for link in world.links_of("nats")]
        async with links_down(run, "nats_outage", nats_links, ALL):
            await asyncio.sleep(0.25 * seconds)
        # JetStream silent: connected, but every PubAck comes after the publish timeout,
        # so each attempt fails and counts; then time is compressed (fast-forward).
        publishers = [f"{role.name}_nats" for role in world.roles_of("publisher")]
        async with toxic_on(run, "nats_silent", publishers, SILENT_NATS):
            await wait_for_failing_rows(world, timeout=0.20 * seconds)
            await fast_forward(run)
            await asyncio.sleep(0.05 * seconds)
        await sleep_until(begin + 0.62 * seconds)
        link = f"consumer-{OUTAGE_DURABLE}_handler"
        async with links_down(run, "handler_outage", [link], frozenset({OUTAGE_DURABLE})):
            await asyncio.sleep(0.25 * seconds)

    async def after_drain(self) -> bool:
        """The operator's part: rows the outage set aside are republished (audited)."""
        return await operator_republish(self.run) > 0
