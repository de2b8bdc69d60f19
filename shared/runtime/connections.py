"""Connections of the roles that serve a whole topology (dlq-router, dlq-replayer).

Each opens one pool per database that holds a durable's inbox and one NATS connection
whose up/down state a readiness check reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shared.adapters.nats import NatsClient, connect_nats
from shared.adapters.postgres import Pool, create_pool_when_up
from shared.contracts.lint import require_clean_topology
from shared.contracts.topology import Topology
from shared.runtime.readiness import ReadinessCheck, postgres_probes
from shared.runtime.settings import CommonSettings


async def target_pools(
    settings: CommonSettings, topology: Topology, stop: asyncio.Event, *, max_size: int = 4
) -> dict[str, Pool]:
    """A pool per database holding some durable's inbox, keyed by database name."""
    names = sorted({topology.context(d.target).database for d in topology.durables.values()})
    pools: dict[str, Pool] = {}
    for name in names:
        pools[name] = await create_pool_when_up(settings.dsn(name), max_size=max_size, stop=stop)
    return pools


class Connected:
    """A NATS connection whose up/down state a readiness check can read."""

    def __init__(self) -> None:
        self.up = False
        self.nc: NatsClient | None = None

    async def open(self, settings: CommonSettings, name: str) -> NatsClient:
        """Connect (reconnecting forever) and remember the connection."""
        self.nc = await connect_nats(
            settings.nats_servers(),
            name=name,
            ping_interval=settings.nats_ping_interval,
            auth=settings.nats_auth(),
            on_state=self._state,
        )
        return self.nc

    def _state(self, up: bool) -> None:
        self.up = up


async def close_all(nc: NatsClient | None, pools: dict[str, Pool]) -> None:
    """Close the connection and every pool, whatever state they are in."""
    if nc is not None:
        await nc.close()
    for pool in pools.values():
        await pool.close()


@dataclass
class TopologyConnections:
    """What a whole-topology role connects to: its pools (see :func:`target_pools`) and
    NATS (see :class:`Connected`), for its checked topology."""

    topology: Topology
    pools: dict[str, Pool]
    nats: Connected
    nc: NatsClient

    def checks(self) -> dict[str, ReadinessCheck]:
        """The readiness checks of the connections: ``nats`` and ``postgres``."""
        return {"nats": lambda: self.nats.up, "postgres": postgres_probes(self.pools)}

    async def close(self) -> None:
        """Close NATS and every pool (see :func:`close_all`)."""
        await close_all(self.nc, self.pools)


async def connect_topology(
    settings: CommonSettings, role: str, stop: asyncio.Event
) -> TopologyConnections:
    """Load and lint the settings' topology, then open its pools and NATS (as
    ``role:topology``)."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    pools = await target_pools(settings, topology, stop)
    nats = Connected()
    nc = await nats.open(settings, f"{role}:{topology.name}")
    return TopologyConnections(topology, pools, nats, nc)
