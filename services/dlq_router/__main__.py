"""``python -m services.dlq_router``: the topology's advisories → dead-letter records."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.dlq_router.metrics import RouterMetrics
from shared.contracts.lint import require_clean_topology
from shared.runtime.connections import Connected, close_all, target_pools
from shared.runtime.lifecycle import serve, topology_role_main
from shared.runtime.metrics import RoleMetrics
from shared.runtime.readiness import postgres_probes
from shared.runtime.settings import RouterSettings

from .router import DlqRouter

ROLE = "dlq-router"
log = logging.getLogger("ferry.dlq_router")


async def run(settings: RouterSettings, stop: asyncio.Event) -> int:
    """Route advisories until ``stop``."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    pools = await target_pools(settings, topology, stop)
    nats = Connected()
    nc = await nats.open(settings, f"{ROLE}:{topology.name}")
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    router = DlqRouter(
        topology=topology,
        pools=pools,
        js=nc.jetstream(),
        metrics=RouterMetrics(metrics),
        sweep_margin=settings.sweep_margin,
    )
    log.info("routing advisories of %s from %s", topology.name, topology.advisory_stream)
    try:
        return await serve(
            settings=settings,
            work=lambda inner: router.run(
                inner,
                fetch_timeout=settings.fetch_timeout,
                sweep_interval=settings.sweep_interval or None,
            ),
            checks={
                "nats": lambda: nats.up,
                "postgres": postgres_probes(pools),
                "durable": lambda: router.stats.bound,
            },
            stop=stop,
            drain_deadline=settings.drain_deadline + settings.fetch_timeout,
            metrics=metrics,
        )
    finally:
        await close_all(nc, pools)
        log.info("stopped", extra={"recorded": router.stats.recorded})


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    return topology_role_main(
        role=ROLE,
        prog="python -m services.dlq_router",
        settings_class=RouterSettings,
        run=run,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
