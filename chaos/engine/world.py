"""The world of a chaos run: its own PostgreSQL and nats-server, a Toxiproxy, and every role.

Nothing is shared with anything else on the machine: the run starts a PostgreSQL it may
SIGKILL (data directory of its own), a nats-server it may SIGKILL (store of its own), a
Toxiproxy, and the roles of the sea-vibespro topology. Every role reaches NATS,
PostgreSQL and its handler service through a proxy of its own, so a fault can be put on
one link of one role::

    publisher-sea ──nats──▶ nats-server        consumer-D ──nats──▶ nats-server
                  └─pg────▶ PostgreSQL                    ├─pg────▶ PostgreSQL
                                                          └─handler▶ handler-S ──pg──▶ PostgreSQL

The run itself (workload, accounting, fault control) talks to the servers directly.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import nats
import yaml
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from chaos.engine.roles import ROOT, Role, role_env
from chaos.engine.stall import install_stall
from chaos.engine.tuning import (
    COMMON_SETTINGS,
    CRASHABLE_PG,
    ROLE_SETTINGS,
    Tuning,
    chaos_topology_doc,
)
from chaos.launcher import ToxiproxyProcess, start_toxiproxy
from devstack.nats import NatsServer
from devstack.ports import free_ports
from devstack.postgres import PostgresServer
from shared.access.streams import Caps, is_clean, provision
from shared.adapters.postgres import migrate_database
from shared.contracts.lint import require_clean_topology
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology

#: A single test server holds one replica; JetStream reserves max_bytes up front.
CAPS = Caps(max_replicas=1, max_bytes=256 * 1000**2)


@dataclass(frozen=True)
class ProxyLink:
    """One proxied link of one role."""

    name: str
    role: str
    kind: str  # nats | pg | handler
    port: int
    upstream: str


class World:
    """Servers, proxies and roles of one run (see the module docstring).

    A world of other servers (:mod:`chaos.scenarios.cluster.world`,
    :mod:`chaos.scenarios.pg_failover.world`) overrides the hooks: how its servers start and
    stop, where NATS is, and which links its roles reach directly, not through a proxy."""

    #: Stream caps of the provisioning.
    caps = CAPS
    #: Link kinds the roles reach directly (no proxy; :meth:`_direct_settings` says how).
    direct: frozenset[str] = frozenset()

    def __init__(self, run_dir: Path, seed: int, tuning: Tuning | None = None) -> None:
        self.run_dir, self.seed = run_dir, seed
        self.tuning = tuning or Tuning()
        self.logs = run_dir / "logs"
        self.topology_path = run_dir / "topology.yaml"
        self.topology: Topology | None = None
        self.pg: PostgresServer | None = None
        self.nats: NatsServer | None = None
        self.toxi: ToxiproxyProcess | None = None
        self.client = Toxiproxy()
        self.links: dict[str, ProxyLink] = {}
        self.roles: dict[str, Role] = {}
        self.handler_ports: dict[str, int] = {}
        #: durable -> port of its front (see :class:`Tuning`).
        self.front_ports: dict[str, int] = {}
        #: Per-durable secrets: consumers sign handler calls, handlers verify (as deployed).
        self.secrets: dict[str, str] = {}
        self._pg_base: Path | None = None
        self._proxies: set[str] = set()

    # -- accessors ---------------------------------------------------------------------

    @property
    def topo(self) -> Topology:
        """The run's topology (after :meth:`start`)."""
        assert self.topology is not None, "the world is not started"
        return self.topology

    def postgres(self) -> PostgresServer:
        """The run's PostgreSQL."""
        assert self.pg is not None, "the world is not started"
        return self.pg

    def nats_server(self) -> NatsServer:
        """The run's nats-server."""
        assert self.nats is not None, "the world is not started"
        return self.nats

    def direct_dsn(self, context: str) -> str:
        """DSN of a context's database, not through any proxy (for the run itself)."""
        return self.postgres().dsn(self.topo.context(context).database)

    def operator_env(self) -> dict[str, str]:
        """Environment of a ``ferry`` command an operator runs against this world (direct
        DSNs of every database, the NATS server, the run's topology)."""
        dsns = {c: self.direct_dsn(c) for c in self.topo.contexts}
        return role_env(
            {},
            FERRY_TOPOLOGY=str(self.topology_path),
            PYTHONPATH=str(ROOT),
            FERRY_DATABASES=json.dumps(dsns),
            FERRY_NATS_URL=self.nats_server().url,
        )

    def links_of(self, kind: str) -> list[ProxyLink]:
        """Every proxied link of a kind, in a stable order."""
        return [link for _, link in sorted(self.links.items()) if link.kind == kind]

    def roles_of(self, kind: str) -> list[Role]:
        """Every role of a kind, in a stable order."""
        return [role for _, role in sorted(self.roles.items()) if role.kind == kind]

    # -- start and stop ----------------------------------------------------------------

    async def start(self) -> None:
        """Start servers, create databases and streams, proxies, then every role."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        await self._start_servers()
        await self._prepare_topology()
        await self._start_toxiproxy()
        await self._start_roles_behind_proxies()

    async def _start_roles_behind_proxies(self) -> None:
        """Plan every role, create the proxies of its links, then start the roles."""
        self._plan_roles()
        await self._create_proxies()
        self._start_roles()

    async def _start_toxiproxy(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.toxi = await asyncio.to_thread(
            start_toxiproxy, self.logs / "toxiproxy.log", seed=self.seed
        )
        self.client.update_api_consumer(self.toxi.host, self.toxi.port)

    async def _create_proxies(self) -> None:
        """Every proxy not created yet."""
        for link in self.links.values():
            if link.name not in self._proxies:
                await asyncio.to_thread(self._create_proxy, link)
                self._proxies.add(link.name)

    def _start_roles(self) -> None:
        for kind in ("handler", "front", "router", "publisher", "consumer"):
            for role in self.roles_of(kind):
                if not role.held_down:  # a replica planned for later stays down
                    role.start()

    def _create_proxy(self, link: ProxyLink) -> None:
        """Create one proxy; an error names the proxy and says what the server answered."""
        doc = {"name": link.name, "upstream": link.upstream, "listen": f"127.0.0.1:{link.port}"}
        response = APIConsumer.post("/proxies", json=doc)
        if response.status_code != 201:
            raise RuntimeError(
                f"toxiproxy refused proxy {link.name!r} ({response.status_code}): {response.text}"
            )

    async def _start_servers(self) -> None:
        # PostgreSQL runs as an unprivileged user when we are root; it needs a directory
        # it can reach (a pytest tmp_path sits under a 0700 directory of root's).
        self._pg_base = Path(tempfile.mkdtemp(prefix="ferry-chaos-pg-"))
        self._pg_base.chmod(0o711)
        self.pg = PostgresServer(
            self._pg_base / "data",
            log_path=self.logs / "postgres.log",
            extra_settings=CRASHABLE_PG,
        )
        self.logs.mkdir(parents=True, exist_ok=True)
        self.nats = NatsServer(self.run_dir / "nats")
        await start_all(self.pg.start, self.nats.start)

    def _nats_urls(self) -> list[str]:
        """Where the run (not its roles) reaches NATS."""
        return [self.nats_server().url]

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
        nc = await nats.connect(servers=self._nats_urls(), connect_timeout=5)
        try:
            changes = await provision(nc.jetstream(), self.topology, caps=self.caps)
        finally:
            await nc.close()
        if not is_clean(changes):
            raise RuntimeError("provisioning failed: " + "; ".join(c.describe() for c in changes))

    def _plan_roles(self) -> None:
        topo = self.topo
        # Every port at once: separate free_port() calls may hand out one port twice.
        replicas = max(self.tuning.consumer_replicas, 1)
        count = (3 * replicas + 1) * len(topo.durables) + 4 * len(topo.contexts) + 4
        self._ports = iter(free_ports(count))
        self.secrets = {name: secrets.token_urlsafe(24) for name in topo.durables}
        targets = sorted({d.target for d in topo.durables.values()})
        for service in targets:
            self.handler_ports[service] = next(self._ports)
            durables = frozenset(n for n, d in topo.durables.items() if d.target == service)
            self._add_role(
                f"handler-{service}",
                "handler",
                [
                    "-m",
                    "services.handlers",
                    "--service",
                    service,
                    "--port",
                    str(self.handler_ports[service]),
                ],
                links=("pg",),
                durables=durables,
            )
        self._add_role("dlq-router", "router", ["-m", "services.dlq_router"], links=("nats", "pg"))
        for context, context_spec in sorted(topo.contexts.items()):
            if context_spec.stream is not None:
                self._add_role(
                    f"publisher-{context}",
                    "publisher",
                    ["-m", "services.outbox_publisher", "--context", context],
                    links=("nats", "pg"),
                )
        for durable, spec in sorted(topo.durables.items()):
            if durable in self.tuning.fronts:
                self._add_front(durable, spec.target)
            starting = self.tuning.replicas_at_start or replicas
            for replica in range(1, replicas + 1):
                name = f"consumer-{durable}" + (f"-r{replica}" if replica > 1 else "")
                self._add_role(
                    name,
                    "consumer",
                    ["-m", "services.inbox_consumer", "--durable", durable],
                    links=("nats", "pg", "handler"),
                    durables=frozenset({durable}),
                    handler_service=spec.target,
                )
                self.roles[name].held_down = replica > starting

    def consumer_replicas(self, durable: str) -> list[Role]:
        """Every consumer process planned for ``durable``, replica 1 first."""
        first = self.roles[f"consumer-{durable}"]
        rest = [r for n, r in sorted(self.roles.items()) if n.startswith(f"{first.name}-r")]
        return [first, *sorted(rest, key=lambda r: int(r.name.rsplit("-r", 1)[1]))]

    def _add_front(self, durable: str, service: str) -> None:
        """A process between ``durable``'s consumer and its handler (see :class:`Tuning`)."""
        port = next(self._ports)
        upstream = f"http://127.0.0.1:{self.handler_ports[service]}/handle"
        argv = [*self.tuning.fronts[durable], "--port", str(port), "--upstream", upstream]
        self._add_role(f"front-{durable}", "front", argv, links=(), durables=frozenset({durable}))
        self.front_ports[durable] = port

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
        direct = [link for link in links if link in self.direct]
        links = tuple(link for link in links if link not in self.direct)
        pg, nats_ = self.postgres(), self.nats_server()
        upstreams = {
            "nats": f"127.0.0.1:{nats_.port}",
            "pg": f"{pg.host}:{pg.port}",
            "handler": f"127.0.0.1:{self.handler_ports.get(handler_service or '', 0)}",
        }
        front = self.front_ports.get(next(iter(durables), "")) if kind == "consumer" else None
        if front is not None:
            upstreams["handler"] = f"127.0.0.1:{front}"
        ports: dict[str, int] = {}
        for link_kind in links:
            link = ProxyLink(
                f"{name}_{link_kind}", name, link_kind, next(self._ports), upstreams[link_kind]
            )
            self.links[link.name] = link
            ports[link_kind] = link.port
        settings = dict(COMMON_SETTINGS, **ROLE_SETTINGS.get(kind, {}))
        settings.update(self.tuning.settings.get(kind, {}))
        settings["FERRY_TOPOLOGY"] = str(self.topology_path)
        settings["PYTHONPATH"] = str(ROOT)
        if "nats" in ports:
            settings["FERRY_NATS_URL"] = f"nats://127.0.0.1:{ports['nats']}"
        if "pg" in ports:
            databases = {
                db: f"postgresql://postgres@127.0.0.1:{ports['pg']}/{db}"
                for db in self.topo.databases()
            }
            settings["FERRY_DATABASES"] = json.dumps(databases)
        if "handler" in ports:
            settings["FERRY_HANDLER_URL"] = f"http://127.0.0.1:{ports['handler']}/handle"
        if kind == "consumer":
            settings["FERRY_DURABLE"] = next(iter(durables))
            settings["FERRY_HANDLER_SECRET"] = self.secrets[settings["FERRY_DURABLE"]]
        if kind == "handler":
            settings["FERRY_HANDLER_SECRETS"] = json.dumps({d: self.secrets[d] for d in durables})
        self.roles[name] = Role(
            name=name,
            kind=kind,
            argv=[sys.executable, *args],
            env=role_env({}, **settings),
            log_path=self.logs / f"{name}.log",
            durables=durables,
        )
        self.roles[name].env.update(self._direct_settings(direct))

    def _direct_settings(self, direct: list[str]) -> dict[str, str]:
        """A role's settings for the links it reaches directly (kinds of :attr:`direct`)."""
        return {}

    async def stop(self) -> None:
        """Stop every role (SIGTERM), the proxy and the servers; keep the logs."""
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.roles.values()))
        if self.toxi is not None:
            await asyncio.to_thread(self.toxi.stop)
        for stop in self._server_stops():
            await asyncio.to_thread(stop)
        if self._pg_base is not None:
            shutil.rmtree(self._pg_base, ignore_errors=True)

    def _server_stops(self) -> list[Callable[[], None]]:
        """How to stop each server that was made, in order."""
        return [s.stop for s in (self.nats, self.pg) if s is not None]


async def start_all(*starts: Callable[[], None]) -> None:
    """Start servers at once; every attempt finishes before a failure is raised (so
    :meth:`World.stop` sees what started)."""
    outcomes = await asyncio.gather(
        *(asyncio.to_thread(start) for start in starts), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
