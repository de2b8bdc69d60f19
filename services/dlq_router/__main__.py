"""``python -m services.dlq_router``: the topology's advisories → dead-letter records."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.dlq_router.metrics import RouterMetrics
from shared.runtime.connections import TopologyConnections
from shared.runtime.lifecycle import TopologyWork, serve_topology, topology_role_main
from shared.runtime.metrics import RoleMetrics
from shared.runtime.settings import RouterSettings

from .router import DlqRouter

ROLE = "dlq-router"
log = logging.getLogger("ferry.dlq_router")


async def run(settings: RouterSettings, stop: asyncio.Event) -> int:
    """Route advisories until ``stop``."""
    return await serve_topology(settings, ROLE, stop, lambda c, m: _router(settings, c, m))


def _router(
    settings: RouterSettings, connected: TopologyConnections, metrics: RoleMetrics
) -> TopologyWork:
    topology = connected.topology
    router = DlqRouter(
        topology=topology,
        pools=connected.pools,
        js=connected.nc.jetstream(),
        metrics=RouterMetrics(metrics),
        sweep_margin=settings.sweep_margin,
        sweep_spent_after=settings.sweep_spent_after,
    )
    log.info("routing advisories of %s from %s", topology.name, topology.advisory_stream)
    return TopologyWork(
        work=lambda inner: router.run(
            inner,
            fetch_timeout=settings.fetch_timeout,
            sweep_interval=settings.sweep_interval or None,
        ),
        checks={"durable": lambda: router.stats.bound},
        drain_deadline=settings.drain_deadline + settings.fetch_timeout,
        stopped=lambda: log.info("stopped", extra={"recorded": router.stats.recorded}),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    return topology_role_main(role=ROLE, settings_class=RouterSettings, run=run, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
