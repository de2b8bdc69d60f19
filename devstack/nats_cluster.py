"""A 3-node JetStream cluster for tests, the chaos suite and ``./dev stack --cluster``.

Three ``nats-server`` processes from the same wheel (:mod:`devstack.nats`), each on free
ports of its own (client, monitoring, cluster), each with its own store directory and the
production server settings of ``k8s/nats/values.yaml``: JetStream on a file store with
``sync_interval: always`` (fsync before every PubAck), a ``cluster`` block with explicit
routes to the two others and ``no_advertise: true`` (clients use the seed list they are
given, nothing the servers gossip).

Routes may be bent through proxies: ``route_ports[(i, j)]`` is the port node ``i`` dials to
reach node ``j`` (default: ``j``'s own cluster port). The chaos suite puts a Toxiproxy
proxy on each of the six directed pairs, so that a partition is the four proxies of one
node disabled.

:meth:`NatsCluster.start` returns once the cluster has a meta leader every node agrees on
and every node's ``/healthz`` answers 200 (JetStream current); :meth:`restart_node` waits
the same way for the node it brings back.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devstack._proc import Served, ServerError
from devstack.nats import DEFAULT_HOST, NatsServer
from devstack.ports import free_ports

if TYPE_CHECKING:
    from shared.access.nats_auth import DevAccess

__all__ = ["CLUSTER_NAME", "CLUSTER_SIZE", "NatsCluster", "RouteTLS", "cluster_block", "seed_list"]

#: The cluster's name (every node's ``cluster { name }``).
CLUSTER_NAME = "ferry"
#: Nodes of the cluster: production runs three (k8s/nats/values.yaml, SDS-047 §10).
CLUSTER_SIZE = 3
#: Seconds :meth:`NatsCluster.wait_ready` waits for a meta leader and healthy nodes.
READY_TIMEOUT = 60.0
#: Advertised route address of nodes whose routes go through proxies: port 1 on loopback,
#: where nothing listens (an implicit route attempt is refused at once and not retried).
NOWHERE = "127.0.0.1:1"
_PROBE_TIMEOUT = 2.0
# No proxies: an http_proxy in the environment must not intercept 127.0.0.1 probes.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def seed_list(urls: list[str]) -> str:
    """The comma-separated seed list of ``FERRY_NATS_URL``."""
    return ",".join(urls)


@dataclass(frozen=True)
class RouteTLS:
    """The routes' TLS: each node's certificate and key (a peer's: server and client use)
    and the CA every peer's certificate must come from (routes verify both ways)."""

    cert: Path
    key: Path
    ca: Path


def cluster_block(
    *,
    name: str,
    listen: str,
    routes: list[str],
    advertise: str | None = None,
    tls: RouteTLS | None = None,
) -> str:
    """The ``cluster`` block of one node's config (as in production, routes explicit).

    ``advertise`` replaces the route address a node tells its peers: a peer that learns of
    a node through gossip before its own configured route is up dials that address (an
    *implicit* route). Routes bent through proxies advertise an address nobody listens on,
    so no route ever bypasses its proxy (a partition would leak through it).
    """
    quoted = ", ".join(json.dumps(route) for route in routes)
    lines = [
        "cluster {",
        f"  name: {json.dumps(name)}",
        f"  listen: {json.dumps(listen)}",
        f"  routes: [{quoted}]",
        "  # Clients learn no other server from this one: they use their seed list.",
        "  no_advertise: true",
    ]
    if advertise is not None:
        lines.append(f"  advertise: {json.dumps(advertise)}")
    if tls is not None:  # routes over TLS, each side verifying the other (issue 47)
        lines += [
            "  tls {",
            f"    cert_file: {json.dumps(str(tls.cert))}",
            f"    key_file: {json.dumps(str(tls.key))}",
            f"    ca_file: {json.dumps(str(tls.ca))}",
            "    verify: true",
            "    timeout: 2",
            "  }",
        ]
    return "\n".join([*lines, "}"])


def _get_json(url: str) -> Any:
    with _HTTP.open(url, timeout=_PROBE_TIMEOUT) as response:
        return json.loads(response.read() or b"{}")


def _status(url: str) -> int:
    try:
        with _HTTP.open(url, timeout=_PROBE_TIMEOUT) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


class NatsCluster(Served):
    """Three nats-server nodes with JetStream, clustered (see the module docstring)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        size: int = CLUSTER_SIZE,
        host: str = DEFAULT_HOST,
        name: str = CLUSTER_NAME,
        access: DevAccess | None = None,
        extra: str = "",
        route_tls: list[RouteTLS] | None = None,
        ports: Mapping[str, list[int]] | None = None,
        start_timeout: float = 30.0,
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        """``ports`` may fix ``client``, ``monitor`` and ``cluster`` ports (one per node);
        every port not given is a free one."""
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        self.base_dir = base_dir.resolve()
        self.size, self.host, self.name = size, host, name
        self.ready_timeout = ready_timeout
        given = dict(ports or {})
        fresh = iter(free_ports(3 * size - sum(len(v) for v in given.values()), host))
        self.client_ports = given.get("client") or [next(fresh) for _ in range(size)]
        self.monitor_ports = given.get("monitor") or [next(fresh) for _ in range(size)]
        self.cluster_ports = given.get("cluster") or [next(fresh) for _ in range(size)]
        for kind, found in (
            ("client", self.client_ports),
            ("monitor", self.monitor_ports),
            ("cluster", self.cluster_ports),
        ):
            if len(found) != size:
                raise ValueError(f"{len(found)} {kind} ports for {size} nodes")
        #: (from, to) -> port node ``from`` dials to reach node ``to`` (see the module doc).
        self.route_ports: dict[tuple[int, int], int] = {
            (i, j): self.cluster_ports[j] for i in range(size) for j in range(size) if i != j
        }
        self._extra, self._access, self._start_timeout = extra, access, start_timeout
        #: Each node's route TLS (None: routes in clear, as on a laptop's loopback).
        self.route_tls = route_tls
        if route_tls is not None and len(route_tls) != size:
            raise ValueError(f"{len(route_tls)} route certificates for {size} nodes")
        self.nodes: list[NatsServer] = []
        self._bent = False
        self._build_nodes()

    # -- configuration -------------------------------------------------------------------

    def node_name(self, index: int) -> str:
        """Server name of node ``index`` (``ferry-n1`` … ``ferry-n3``)."""
        return f"{self.name}-n{index + 1}"

    def route_via(self, route_ports: Mapping[tuple[int, int], int]) -> None:
        """Dial routes through other ports (proxies); takes effect on each node's next start."""
        unknown = set(route_ports) - set(self.route_ports)
        if unknown:
            raise ValueError(f"no such route(s): {sorted(unknown)}")
        self.route_ports.update(route_ports)
        self._bent = True
        self._build_nodes()

    def _build_nodes(self) -> None:
        old = self.nodes
        self.nodes = []
        for index in range(self.size):
            routes = [
                f"nats://{self.host}:{self.route_ports[(index, peer)]}"
                for peer in range(self.size)
                if peer != index
            ]
            block = cluster_block(
                name=self.name,
                listen=f"{self.host}:{self.cluster_ports[index]}",
                routes=routes,
                advertise=NOWHERE if self._bent else None,
                tls=self.route_tls[index] if self.route_tls else None,
            )
            if old and old[index].running:
                raise ServerError(f"{self.node_name(index)} is running; reconfigure it stopped")
            self.nodes.append(
                NatsServer(
                    self.base_dir / self.node_name(index),
                    port=self.client_ports[index],
                    monitor_port=self.monitor_ports[index],
                    host=self.host,
                    server_name=self.node_name(index),
                    extra="\n".join(p for p in (block, self._extra) if p),
                    access=self._access,
                    start_timeout=self._start_timeout,
                )
            )

    # -- addresses -----------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Client URLs of every node (the seed list)."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """The seed list as ``FERRY_NATS_URL`` takes it: comma-separated."""
        return seed_list(self.urls)

    @property
    def access(self) -> DevAccess | None:
        """The users every node authorizes (None: no authentication)."""
        return self._access

    def index_of(self, server_name: str) -> int:
        """The index of the node called ``server_name``."""
        for index in range(self.size):
            if self.node_name(index) == server_name:
                return index
        raise KeyError(server_name)

    def monitor_url(self, index: int, path: str) -> str:
        """``http://host:monitor/path`` of node ``index``."""
        return f"http://{self.host}:{self.monitor_ports[index]}/{path.lstrip('/')}"

    # -- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start every node, then wait for a meta leader and every node healthy."""
        try:
            for node in self.nodes:
                if not node.running:
                    node.start()
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        """Stop every running node gracefully (SIGTERM)."""
        errors = []
        for node in self.nodes:
            try:
                node.stop()
            except ServerError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def kill(self) -> None:
        """SIGKILL every running node."""
        for node in self.nodes:
            node.kill()

    def kill_node(self, index: int) -> None:
        """SIGKILL one node (its store stays)."""
        self.nodes[index].kill()

    def start_node(self, index: int, *, wait: bool = True) -> None:
        """Start one node on its store; with ``wait``, until the cluster is ready again."""
        self.nodes[index].start()
        if wait:
            self.wait_ready()

    def restart_node(self, index: int, *, wait: bool = True) -> None:
        """Stop one node gracefully and start it again on its store."""
        self.nodes[index].stop()
        self.start_node(index, wait=wait)

    # -- state ---------------------------------------------------------------------------

    def jsz(self, index: int) -> dict[str, Any]:
        """Node ``index``'s ``/jsz`` document ({} when it does not answer)."""
        try:
            doc = _get_json(self.monitor_url(index, "jsz"))
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def meta_leader(self, index: int | None = None) -> str | None:
        """The meta leader's server name as node ``index`` (default: any running) sees it."""
        indexes = [index] if index is not None else self.running_indexes()
        for i in indexes:
            leader = self.jsz(i).get("meta_cluster", {}).get("leader")
            if leader:
                return str(leader)
        return None

    def stream_leaders(self, index: int) -> dict[str, str]:
        """Stream name -> leader's server name, as node ``index`` sees it (``/jsz``)."""
        try:
            doc = _get_json(self.monitor_url(index, "jsz?accounts=true&streams=true"))
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        leaders = {}
        for account in doc.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                leader = (stream.get("cluster") or {}).get("leader")
                if leader:
                    leaders[str(stream["name"])] = str(leader)
        return leaders

    def running_indexes(self) -> list[int]:
        """Indexes of the nodes whose process runs."""
        return [i for i, node in enumerate(self.nodes) if node.running]

    def healthy(self, index: int) -> bool:
        """``/healthz`` of node ``index`` answers 200: JetStream enabled and current."""
        return _status(self.monitor_url(index, "healthz")) == 200

    def ready_problems(self, indexes: list[int] | None = None) -> list[str]:
        """What keeps the cluster from being ready (empty: ready)."""
        indexes = self.running_indexes() if indexes is None else indexes
        names = {i: self.node_name(i) for i in indexes}
        problems = [f"{names[i]} not running" for i in indexes if not self.nodes[i].running]
        leaders = {i: self.meta_leader(i) for i in indexes}
        blind = [names[i] for i, leader in leaders.items() if not leader]
        if blind:
            problems.append(f"no meta leader seen by {', '.join(blind)}")
        elif len(set(leaders.values())) > 1:
            seen = sorted({leader or "" for leader in leaders.values()})
            problems.append(f"nodes disagree on the meta leader: {seen}")
        problems += [f"{names[i]} /healthz not 200" for i in indexes if not self.healthy(i)]
        return problems

    def wait_ready(self, timeout: float | None = None, indexes: list[int] | None = None) -> None:
        """Wait until the running nodes (or ``indexes``) agree on a meta leader and each
        answers ``/healthz`` with 200; raise :class:`ServerError` naming what is missing."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        problems = ["not checked"]
        while time.monotonic() < deadline:
            problems = self.ready_problems(indexes)
            if not problems:
                return
            time.sleep(0.2)
        raise ServerError(f"JetStream cluster not ready: {'; '.join(problems)}")
