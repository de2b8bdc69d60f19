"""``python -m services.dlq_replayer``: automatic replays of the topology's dead letters."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.dlq_replayer.metrics import ReplayerMetrics
from shared.runtime.connections import TopologyConnections
from shared.runtime.lifecycle import TopologyWork, serve_topology, topology_role_main
from shared.runtime.metrics import RoleMetrics
from shared.runtime.settings import ReplayerSettings

from .replayer import DlqReplayer

ROLE = "dlq-replayer"
log = logging.getLogger("ferry.dlq_replayer")


async def run(settings: ReplayerSettings, stop: asyncio.Event) -> int:
    """Replay until ``stop``."""
    return await serve_topology(settings, ROLE, stop, lambda c, m: _replayer(settings, c, m))


def _replayer(
    settings: ReplayerSettings, connected: TopologyConnections, metrics: RoleMetrics
) -> TopologyWork:
    topology = connected.topology
    replayer = DlqReplayer(
        topology=topology,
        pools=connected.pools,
        js=connected.nc.jetstream(),
        batch_size=settings.batch_size,
        metrics=ReplayerMetrics(metrics),
        unconfirmed_after=settings.unconfirmed_after,
    )
    automatic = replayer.automatic() or ["none: every durable is operator-only"]
    log.info("replaying dead letters of %s (automatic: %s)", topology.name, ", ".join(automatic))
    return TopologyWork(
        work=lambda inner: replayer.run(inner, interval=settings.interval),
        checks={"scanning": lambda: replayer.ready},
        drain_deadline=settings.drain_deadline,
        stopped=lambda: log.info("stopped", extra={"replayed": replayer.stats.replayed}),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    return topology_role_main(role=ROLE, settings_class=ReplayerSettings, run=run, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
