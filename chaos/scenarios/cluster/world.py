"""The world of the cluster scenarios: :class:`~chaos.engine.world.World` on a 3-node JetStream
cluster (:class:`devstack.nats_cluster.NatsCluster`) instead of one nats-server.

Every route between two nodes goes through a Toxiproxy proxy of its own, one per direction
(``route_n1_n2`` is what n1 dials to reach n2), so a partition is a node's four proxies
disabled: nothing of it reaches the others and nothing of theirs reaches it. The roles
connect straight to the cluster with its seed list (``FERRY_NATS_URL`` comma-separated);
their PostgreSQL and handler links are proxied as in every other run. Streams are
provisioned with the topology's 3 replicas.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from chaos.engine.tuning import CRASHABLE_PG, Tuning
from chaos.engine.world import ProxyLink, World, start_all
from devstack.nats import NatsServer
from devstack.nats_cluster import CLUSTER_SIZE, NatsCluster
from devstack.ports import free_ports
from devstack.postgres import PostgresServer
from shared.access.streams import Caps

#: Streams keep the topology's replicas (3); JetStream reserves max_bytes on every node.
CLUSTER_CAPS = Caps(max_replicas=3, max_bytes=256 * 1000**2)


def route_link_name(source: int, target: int) -> str:
    """The proxy node ``source`` dials to reach node ``target`` (0-based indexes)."""
    return f"route_n{source + 1}_n{target + 1}"


class ClusterWorld(World):
    """Servers, proxies and roles of one cluster run (see the module docstring)."""

    caps = CLUSTER_CAPS
    direct = frozenset({"nats"})

    def __init__(self, run_dir: Path, seed: int, tuning: Tuning | None = None) -> None:
        super().__init__(run_dir, seed, tuning)
        self.cluster: NatsCluster | None = None
        self._pg_port: int | None = None

    # -- accessors ---------------------------------------------------------------------

    def nodes(self) -> NatsCluster:
        """The run's JetStream cluster."""
        assert self.cluster is not None, "the world is not started"
        return self.cluster

    def nats_server(self) -> NatsServer:
        """The cluster's first node (what a single-server caller gets)."""
        return self.nodes().nodes[0]

    def route_links_of(self, index: int) -> list[str]:
        """The four route proxies of node ``index``: its routes out and the others' in."""
        size = self.nodes().size
        return [
            route_link_name(a, b)
            for a in range(size)
            for b in range(size)
            if a != b and index in (a, b)
        ]

    # -- start and stop ----------------------------------------------------------------

    async def start(self) -> None:
        """Toxiproxy and the route proxies first, then the servers, streams and roles."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        await self._start_toxiproxy()
        # Every port at once (the nodes' and the route proxies'): ports picked in separate
        # calls may collide, one call's ports being free again by the next.
        size = CLUSTER_SIZE
        pairs = [(a, b) for a in range(size) for b in range(size) if a != b]
        ports = free_ports(3 * size + len(pairs) + 1)
        self._pg_port = ports.pop()
        self.cluster = NatsCluster(
            self.run_dir / "nats",
            ports={
                "client": ports[:size],
                "monitor": ports[size : 2 * size],
                "cluster": ports[2 * size : 3 * size],
            },
        )
        for (a, b), port in zip(pairs, ports[3 * size :], strict=True):
            upstream = f"127.0.0.1:{self.cluster.cluster_ports[b]}"
            name = route_link_name(a, b)
            self.links[name] = ProxyLink(name, self.cluster.node_name(a), "route", port, upstream)
        await self._create_proxies()
        self.cluster.route_via({pair: self.links[route_link_name(*pair)].port for pair in pairs})
        await self._start_servers()
        await self._prepare_topology()
        await self._start_roles_behind_proxies()

    async def _start_servers(self) -> None:
        self._pg_base = Path(tempfile.mkdtemp(prefix="ferry-chaos-pg-"))
        self._pg_base.chmod(0o711)
        self.pg = PostgresServer(
            self._pg_base / "data",
            port=self._pg_port,
            log_path=self.logs / "postgres.log",
            extra_settings=CRASHABLE_PG,
        )
        await start_all(self.pg.start, self.nodes().start)

    def _nats_urls(self) -> list[str]:
        return self.nodes().urls

    def _direct_settings(self, direct: list[str]) -> dict[str, str]:
        """A role's NATS is the cluster's seed list, not a proxy."""
        settings = {"FERRY_MAX_STREAM_REPLICAS": str(CLUSTER_CAPS.max_replicas)}
        if "nats" in direct:
            settings["FERRY_NATS_URL"] = self.nodes().url
        return settings

    def _server_stops(self) -> list[Callable[[], None]]:
        return [s for s in (self.cluster and self.cluster.kill, self.pg and self.pg.stop) if s]
