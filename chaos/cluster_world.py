"""The world of the cluster scenarios: :class:`~chaos.world.World` on a 3-node JetStream
cluster (:class:`devstack.nats_cluster.NatsCluster`) instead of one nats-server.

Every route between two nodes goes through a Toxiproxy proxy of its own, one per direction
(``route_n1_n2`` is what n1 dials to reach n2), so a partition is a node's four proxies
disabled: nothing of it reaches the others and nothing of theirs reaches it. The roles
connect straight to the cluster with its seed list (``FERRY_NATS_URL`` comma-separated);
their PostgreSQL and handler links are proxied as in every other run. Streams are
provisioned with the topology's 3 replicas.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import asyncpg
import nats
import yaml

from chaos.launcher import start_toxiproxy
from chaos.stall import install_stall
from chaos.world import CRASHABLE_PG, ProxyLink, Tuning, World, chaos_topology_doc
from devstack.nats import NatsServer
from devstack.nats_cluster import CLUSTER_SIZE, NatsCluster
from devstack.ports import free_ports
from devstack.postgres import PostgresServer
from shared.access.streams import Caps, is_clean, provision
from shared.adapters.postgres import migrate_database
from shared.contracts.lint import require_clean_topology
from shared.contracts.loading import load_topology

#: Streams keep the topology's replicas (3); JetStream reserves max_bytes on every node.
CLUSTER_CAPS = Caps(max_replicas=3, max_bytes=256 * 1000**2)


def route_link_name(source: int, target: int) -> str:
    """The proxy node ``source`` dials to reach node ``target`` (0-based indexes)."""
    return f"route_n{source + 1}_n{target + 1}"


class ClusterWorld(World):
    """Servers, proxies and roles of one cluster run (see the module docstring)."""

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
        self.logs.mkdir(parents=True, exist_ok=True)
        self.toxi = await asyncio.to_thread(
            start_toxiproxy, self.logs / "toxiproxy.log", seed=self.seed
        )
        self.client.update_api_consumer(self.toxi.host, self.toxi.port)
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
            link = ProxyLink(name, self.cluster.node_name(a), "route", port, upstream)
            self.links[link.name] = link
            await asyncio.to_thread(self._create_proxy, link)
        self.cluster.route_via({pair: self.links[route_link_name(*pair)].port for pair in pairs})
        await self._start_servers()
        await self._prepare_topology()
        self._plan_roles()
        for link in self.links.values():
            if link.kind != "route":
                await asyncio.to_thread(self._create_proxy, link)
        for kind in ("handler", "front", "router", "publisher", "consumer"):
            for role in self.roles_of(kind):
                if not role.held_down:
                    role.start()

    async def _start_servers(self) -> None:
        self._pg_base = Path(tempfile.mkdtemp(prefix="ferry-chaos-pg-"))
        self._pg_base.chmod(0o711)
        self.pg = PostgresServer(
            self._pg_base / "data",
            port=self._pg_port,
            log_path=self.logs / "postgres.log",
            extra_settings=CRASHABLE_PG,
        )
        outcomes = await asyncio.gather(
            asyncio.to_thread(self.pg.start),
            asyncio.to_thread(self.nodes().start),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _prepare_topology(self) -> None:
        self.topology_path.write_text(yaml.safe_dump(chaos_topology_doc(self.tuning)))
        self.topology = load_topology(self.topology_path)
        require_clean_topology(self.topology, source=self.topology_path)
        for database in self.topology.databases():
            dsn = self.postgres().dsn(database)
            await migrate_database(dsn)
            conn = await asyncpg.connect(dsn)
            try:
                await install_stall(conn)
            finally:
                await conn.close()
        nc = await nats.connect(servers=self.nodes().urls, connect_timeout=5)
        try:
            changes = await provision(nc.jetstream(), self.topology, caps=CLUSTER_CAPS)
        finally:
            await nc.close()
        if not is_clean(changes):
            raise RuntimeError("provisioning failed: " + "; ".join(c.describe() for c in changes))

    def _add_role(
        self,
        name: str,
        kind: str,
        args: list[str],
        *,
        links: tuple[str, ...],
        durables: frozenset[str] = frozenset(),
        handler_service: str | None = None,
    ) -> None:
        """As in :class:`World`, but a role's NATS is the cluster's seed list, not a proxy."""
        super()._add_role(
            name,
            kind,
            args,
            links=tuple(link for link in links if link != "nats"),
            durables=durables,
            handler_service=handler_service,
        )
        env = self.roles[name].env
        env["FERRY_MAX_STREAM_REPLICAS"] = str(CLUSTER_CAPS.max_replicas)
        if "nats" in links:
            env["FERRY_NATS_URL"] = self.nodes().url

    async def stop(self) -> None:
        """Stop every role, the proxy, the cluster and PostgreSQL; keep the logs."""
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.roles.values()))
        if self.toxi is not None:
            await asyncio.to_thread(self.toxi.stop)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.kill)
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop)
        if self._pg_base is not None:
            shutil.rmtree(self._pg_base, ignore_errors=True)
