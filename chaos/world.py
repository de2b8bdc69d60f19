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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import nats
import yaml
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from chaos.launcher import ToxiproxyProcess, start_toxiproxy
from chaos.roles import ROOT, Role, role_env
from chaos.stall import install_stall
from devstack.nats import NatsServer
from devstack.ports import free_ports
from devstack.postgres import PostgresServer
from shared.access.streams import Caps, is_clean, provision
from shared.adapters.postgres import migrate_database
from shared.contracts.lint import require_clean_topology
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology

#: The topology whose roles the run exercises (both directions of SEA <-> VibesPro).
TOPOLOGY = ROOT / "topologies" / "sea-vibespro.yaml"
#: A single test server holds one replica; JetStream reserves max_bytes up front.
CAPS = Caps(max_replicas=1, max_bytes=256 * 1000**2)
#: SIGKILLed, not power-cut: an acknowledged commit survives in the page cache.
CRASHABLE_PG = {"fsync": "off"}
#: Durable clocks short enough for a run measured in minutes. With 12 deliveries and this
#: ladder an event outlives any single fault of a schedule; ``replay: operator`` keeps
#: dead letters where they are (the replayer is not part of the run).
DURABLE_CLOCKS: dict[str, Any] = {
    "ack_wait": "6s",
    "max_deliver": 12,
    "backoff": ["500ms", "1s", "2s", "3s"],
    "replay": "operator",
}
#: Below the 5 s latency fault, so that fault opens the "200 sent, answer lost" window.
HANDLER_TIMEOUT = "3s"
#: Settings every role gets (a dead NATS link is noticed within ~3 s).
COMMON_SETTINGS = {
    "FERRY_MAX_STREAM_REPLICAS": "1",
    "FERRY_MAX_STREAM_BYTES": "256MB",
    "FERRY_LOG_LEVEL": "INFO",
    "FERRY_NATS_PING_INTERVAL": "1",
}
ROLE_SETTINGS: dict[str, dict[str, str]] = {
    "publisher": {
        "FERRY_POLL_INTERVAL": "0.2",
        "FERRY_PUBLISH_TIMEOUT": "2",
        "FERRY_BATCH_SIZE": "100",
        "FERRY_RETRY_MAX": "1",
    },
    "consumer": {
        "FERRY_FETCH_TIMEOUT": "0.5",
        "FERRY_LEASE_MARGIN": "2",
        "FERRY_CONCURRENCY": "32",
    },
    # The workload's fault classes are _ferry_test payload directives (chaos/workload.py),
    # obeyed only with this setting on.
    "handler": {"FERRY_HANDLER_FAULT_INJECTION": "true"},
    "router": {"FERRY_FETCH_TIMEOUT": "0.5"},
}


@dataclass(frozen=True)
class Tuning:
    """What a scenario changes in the world: clocks, role settings, handler fronts."""

    #: Set on every durable (see :data:`DURABLE_CLOCKS`).
    clocks: dict[str, Any] = field(default_factory=lambda: dict(DURABLE_CLOCKS))
    handler_timeout: str = HANDLER_TIMEOUT
    #: Extra settings per role kind (``publisher``, ``consumer``, ``handler``, ``router``).
    settings: dict[str, dict[str, str]] = field(default_factory=dict)
    #: durable -> ``python -m`` argv of a process put between its consumer and its
    #: handler; it is given ``--port P --upstream URL`` and runs as role ``front-<durable>``.
    fronts: dict[str, list[str]] = field(default_factory=dict)
    #: durable -> topology fields set on it after the clocks (``ordering``, ...).
    durables: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: context -> fields set on its stream (``partitions``, ...).
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Consumer processes planned per durable: ``consumer-<durable>``, then
    #: ``consumer-<durable>-r2`` ... (each with links of its own).
    consumer_replicas: int = 1
    #: How many of them start with the world (the others wait, held down, for the run to
    #: start them); None: all.
    replicas_at_start: int | None = None


@dataclass(frozen=True)
class ProxyLink:
    """One proxied link of one role."""

    name: str
    role: str
    kind: str  # nats | pg | handler
    port: int
    upstream: str


def chaos_topology_doc(tuning: Tuning | None = None) -> dict[str, Any]:
    """The shipped sea-vibespro topology with the chaos clocks on its durables."""
    tuning = tuning or Tuning()
    doc: dict[str, Any] = yaml.safe_load(TOPOLOGY.read_text())
    for name, durable in doc["durables"].items():
        durable.update(tuning.clocks)
        durable["handler"]["timeout"] = tuning.handler_timeout
        durable.update(tuning.durables.get(name, {}))
    for name, fields_ in tuning.streams.items():
        doc["contexts"][name]["stream"].update(fields_)
    return doc


class World:
    """Servers, proxies and roles of one run (see the module docstring)."""

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
        self.toxi = await asyncio.to_thread(
            start_toxiproxy, self.logs / "toxiproxy.log", seed=self.seed
        )
        self.client.update_api_consumer(self.toxi.host, self.toxi.port)
        self._plan_roles()
        for link in self.links.values():
            await asyncio.to_thread(self._create_proxy, link)
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
        # Both attempts finish before any failure is raised, so stop() sees what started.
        outcomes = await asyncio.gather(
            asyncio.to_thread(self.pg.start),
            asyncio.to_thread(self.nats.start),
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
        nc = await nats.connect(self.nats_server().url, connect_timeout=5)
        try:
            changes = await provision(nc.jetstream(), self.topology, caps=CAPS)
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

    async def stop(self) -> None:
        """Stop every role (SIGTERM), the proxy and the servers; keep the logs."""
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.roles.values()))
        if self.toxi is not None:
            await asyncio.to_thread(self.toxi.stop)
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop)
        if self._pg_base is not None:
            shutil.rmtree(self._pg_base, ignore_errors=True)
