"""The bench's world: servers, and deployments of Ferry's roles as real processes.

Everything runs on this machine: one nats-server (file store, ``sync_interval: always``,
as :mod:`devstack.nats` always writes it) and one PostgreSQL with its default durability
settings (fsync and synchronous_commit on), both in a temporary directory. Each
measurement gets a fresh :class:`Deployment` — its own databases (a prefix per
deployment), every stream deleted and provisioned anew — so nothing one measurement
leaves behind is seen by the next.

Roles run as the commands an operator runs (``python -m services.outbox_publisher``
...), configured only through ``FERRY_*`` variables, each in its own process, so that
no GIL is shared between them and the load generator (:mod:`bench.procs` starts
them). The servers' :class:`~bench.books.CpuBook` reads the CPU time of every process
(PostgreSQL's whole process tree included) at the start and end of a measurement.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
import asyncpg
import nats
import yaml

from bench.books import CpuBook, batch_histogram
from bench.common import ROOT
from bench.procs import PYTHON, Proc, clean_environ, spawn, wait_http
from devstack.nats import NatsServer
from devstack.ports import free_port
from devstack.postgres import PostgresServer
from shared.access.streams import Caps, provision
from shared.adapters.postgres import migrate_database
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology

#: Every stream's max_bytes (JetStream reserves it on disk); 100,000 events need ~60 MB.
STREAM_BYTES = "2GB"
#: The sampler every tracing-on measurement uses: 10 % of new traces, parents obeyed.
TRACES_SAMPLER = "parentbased_traceidratio"
TRACES_RATIO = "0.1"
_tracing = {"ratio": TRACES_RATIO}


def set_traces_ratio(ratio: float) -> None:
    """The sampling ratio of tracing-on runs (``--trace-ratio``): the roles' sampler and
    the share of backlog rows whose stored traceparent is sampled."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"a sampling ratio is between 0 and 1, not {ratio}")
    _tracing["ratio"] = f"{ratio:g}"


def traces_ratio() -> str:
    """The sampling ratio of tracing-on runs, as the roles' FERRY_TRACES_SAMPLER_ARG."""
    return _tracing["ratio"]


_deployments = itertools.count(1)


@dataclass(frozen=True)
class TlsHops:
    """The TLS arm of a deployment (issue 47): the roles reach NATS over ``tls://`` and
    the consumer calls its handler over HTTPS, every certificate from one local CA.

    Server authentication only (no client certificates); PostgreSQL stays as it is."""

    #: The CA every client verifies its server with (FERRY_NATS_TLS_CA,
    #: FERRY_HANDLER_TLS_CA).
    ca: Path
    #: The roles' NATS URL (``tls://127.0.0.1:PORT``).
    nats_url: str
    #: The handler's certificate and key (FERRY_HANDLER_TLS_CERT/_KEY), for 127.0.0.1.
    handler_cert: Path
    handler_key: Path

    def client_context(self) -> ssl.SSLContext:
        """A context that verifies the handler (the bench's readiness probe)."""
        return ssl.create_default_context(cafile=str(self.ca))


def _server_pid(server: NatsServer | PostgresServer) -> int:
    # devstack keeps the child it spawned privately; the bench only reads its pid.
    spawned = server._spawned
    if spawned is None:
        raise RuntimeError("server is not running")
    return int(spawned.proc.pid)


class Servers:
    """nats-server and PostgreSQL in ``base`` for the whole run, and the OTLP sink."""

    def __init__(self, base: Path, *, statements: bool = False) -> None:
        self.base = base
        self.nats = NatsServer(base / "nats")
        #: pg_stat_statements loaded (``--statements``): round trips per message per step.
        self.statements = statements
        settings = {"shared_preload_libraries": "pg_stat_statements"} if statements else {}
        self.pg = PostgresServer(base / "pg" / "data", extra_settings=settings)
        self.book = CpuBook()
        #: The context that verifies a nats-server requiring TLS (the TLS section's arm).
        self.nats_tls: ssl.SSLContext | None = None
        self.sink: Proc | None = None
        self.sink_port: int | None = None

    def __enter__(self) -> Self:
        self.nats.start()
        try:
            self.pg.start()
        except BaseException:
            self.nats.stop()
            raise
        self.book.add("nats-server", _server_pid(self.nats))
        self.book.add("postgres", _server_pid(self.pg), tree=True)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.pg.stop()
        finally:
            self.nats.stop()

    async def connect_nats(self) -> Any:
        """The bench's own connection to :attr:`nats` (over TLS when it requires it)."""
        if self.nats_tls is None:
            return await nats.connect(self.nats.url)
        return await nats.connect(self.nats.url, tls=self.nats_tls)

    async def statement_counts(self) -> dict[str, tuple[float, float]]:
        """Per statement text: calls and total execution ms so far, every database summed.

        Empty unless the run loads pg_stat_statements (``--statements``).
        """
        if not self.statements:
            return {}
        conn = await asyncpg.connect(self.pg.dsn())
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = await conn.fetch(
                "SELECT query, sum(calls) AS calls, sum(total_exec_time) AS ms"
                " FROM pg_stat_statements GROUP BY query"
            )
        finally:
            await conn.close()
        return {r["query"]: (float(r["calls"]), float(r["ms"])) for r in rows}

    async def checkpoint(self) -> float:
        """Have PostgreSQL write a checkpoint now; the seconds it took.

        A drain writes hundreds of megabytes of WAL, and the checkpoint that follows is
        spread over minutes, its writes competing with a fixed-rate step's commits. In one
        full run the producer's commit p99 at 600 msg/s, right after the drains, was 176
        ms, against 13 ms in a run of that step alone. Taken before each step, the step
        starts with no checkpoint pending, as the bare-bones pipeline's early steps do.
        """
        started = time.monotonic()
        conn = await asyncpg.connect(self.pg.dsn())
        try:
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()
        return time.monotonic() - started

    async def start_sink(self, logs: Path) -> None:
        """Start the OTLP sink that stands in for a collector (tracing-on runs)."""
        self.sink_port = free_port()
        argv = [PYTHON, "-m", "bench.otlp_sink", "--port", str(self.sink_port)]
        self.sink = await spawn("otlp-sink", "sink", argv, clean_environ(), logs)
        await wait_http(f"http://127.0.0.1:{self.sink_port}/stats", self.sink)
        self.book.add("otlp-sink", self.sink.pid)

    async def sink_stats(self) -> dict[str, int]:
        """Requests, spans and bytes the sink has received so far."""
        if self.sink_port is None:
            return {"requests": 0, "spans": 0, "bytes": 0}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.sink_port}/stats") as resp,
        ):
            stats: dict[str, int] = await resp.json()
            return stats

    async def stop_sink(self) -> None:
        """Stop the sink."""
        if self.sink is not None:
            await self.sink.stop()
            self.book.forget("otlp-sink")
            self.sink = None

    def tracing_env(self, on: bool) -> dict[str, str]:
        """FERRY_* variables for tracing on (OTLP to the sink, parent-based at
        :func:`traces_ratio`, 10 % by default) or off."""
        if not on:
            return {"FERRY_TRACES_EXPORTER": "none"}
        if self.sink_port is None:
            raise RuntimeError("tracing on needs the OTLP sink started")
        return {
            "FERRY_TRACES_EXPORTER": "otlp",
            "FERRY_OTLP_PROTOCOL": "http/protobuf",
            "FERRY_OTLP_ENDPOINT": f"http://127.0.0.1:{self.sink_port}",
            "FERRY_TRACES_SAMPLER": TRACES_SAMPLER,
            "FERRY_TRACES_SAMPLER_ARG": traces_ratio(),
        }


@dataclass
class Deployment:
    """One topology on fresh databases and fresh streams, and the roles started on it."""

    servers: Servers
    topology_name: str
    tracing: bool
    logs: Path
    label: str
    prefix: str = field(default_factory=lambda: f"b{next(_deployments)}")
    procs: list[Proc] = field(default_factory=list)
    #: The roles' names in the CPU book (``publisher-sea``, ``consumer-<durable>-1`` ...).
    role_names: list[str] = field(default_factory=list)
    #: Settings every role of this deployment gets (``python -m bench --set``).
    role_settings: dict[str, str] = field(default_factory=dict)
    #: Each role's /metrics address, by its name in the CPU book.
    metrics_urls: dict[str, str] = field(default_factory=dict)
    #: Each handler's process id, by its name in the CPU book.
    handler_pids: dict[str, int] = field(default_factory=dict)
    #: Changes the topology document before it is written (the ordered drain declares a
    #: partitioned stream and an ``ordering: key`` durable this way).
    patch: Callable[[dict[str, Any]], None] | None = None
    #: The TLS arm (:class:`TlsHops`): NATS over TLS and the handler over HTTPS; None:
    #: plain text, as every other measurement runs.
    tls: TlsHops | None = None

    async def __aenter__(self) -> Self:
        doc: dict[str, Any] = yaml.safe_load(
            (ROOT / "topologies" / f"{self.topology_name}.yaml").read_text()
        )
        for ctx in doc["contexts"].values():
            ctx["database"] = f"{self.prefix}_{ctx['database']}"
        if self.patch is not None:
            self.patch(doc)
        self.path = self.servers.base / f"{self.prefix}-{self.topology_name}.yaml"
        self.path.write_text(yaml.safe_dump(doc))
        self.topology: Topology = load_topology(self.path)
        for database in self.topology.databases():
            await migrate_database(self.servers.pg.dsn(database))
        await self._fresh_streams()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_roles()
        await self._drop_databases()

    async def _fresh_streams(self) -> None:
        nc = await self.servers.connect_nats()
        try:
            js = nc.jetstream()
            for info in await js.streams_info():
                await js.delete_stream(info.config.name or "")
            caps = Caps(max_replicas=1, max_bytes=2 * 1000**3)
            await provision(js, self.topology, caps=caps)
        finally:
            await nc.close()

    async def _drop_databases(self) -> None:
        conn = await asyncpg.connect(self.servers.pg.dsn("postgres"))
        try:
            for database in self.topology.databases():
                await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await conn.close()

    def dsn(self, context: str) -> str:
        """DSN of a context's database."""
        return self.servers.pg.dsn(self.topology.contexts[context].database)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a role (or of the load generator) on this deployment."""
        databases = {d: self.servers.pg.dsn(d) for d in self.topology.databases()}
        env = clean_environ()
        env.update(
            FERRY_TOPOLOGY=str(self.path),
            FERRY_NATS_URL=self.servers.nats.url,
            FERRY_DATABASES=json.dumps(databases),
            FERRY_MAX_STREAM_REPLICAS="1",
            FERRY_MAX_STREAM_BYTES=STREAM_BYTES,
            FERRY_LOG_LEVEL="INFO",
        )
        env.update(self.servers.tracing_env(self.tracing))
        env.update(extra)
        return env

    def role_env(self, **extra: str) -> dict[str, str]:
        """Environment of a role: :meth:`env` with the run's ``--set`` settings (and, in
        the TLS arm, the NATS URL ``tls://`` and the CA that verifies the server)."""
        hops: dict[str, str] = {}
        if self.tls is not None:
            hops = {"FERRY_NATS_URL": self.tls.nats_url, "FERRY_NATS_TLS_CA": str(self.tls.ca)}
        return self.env(**{**self.role_settings, **hops, **extra})

    async def _start(self, name: str, kind: str, argv: list[str], **extra: str) -> Proc:
        port = free_port()
        proc = await spawn(
            f"{self.label}-{name}", kind, argv,
            self.role_env(FERRY_HEALTH_PORT=str(port), **extra), self.logs,
        )  # fmt: skip
        self.procs.append(proc)
        await wait_http(f"http://127.0.0.1:{port}/readyz", proc)
        self.servers.book.add(name, proc.pid)
        self.role_names.append(name)
        self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        return proc

    async def batch_counts(self) -> dict[str, tuple[float, float]]:
        """Per role: (batches, messages in them) so far, from its batch-size histogram.

        The publisher's ``ferry_outbox_batch_rows`` and the consumer's
        ``ferry_consumer_batch_messages``; a role that does not answer is left out.
        """
        counts: dict[str, tuple[float, float]] = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for name, url in self.metrics_urls.items():
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url) as resp:
                        text = await resp.text()
                    found = batch_histogram(text)
                    if found is not None:
                        counts[name] = found
        return counts

    async def start_handler(self, service: str) -> str:
        """Start an example handler service; return its /handle URL (``https://`` in
        the TLS arm, the handler serving its certificate)."""
        port = free_port()
        argv = [PYTHON, "-m", "services.handlers", "--service", service, "--port", str(port)]
        name = f"handler-{service}"
        extra, scheme, probe = {}, "http", None
        if self.tls is not None:
            extra = {"FERRY_HANDLER_TLS_CERT": str(self.tls.handler_cert),
                     "FERRY_HANDLER_TLS_KEY": str(self.tls.handler_key)}  # fmt: skip
            scheme, probe = "https", self.tls.client_context()
        env = self.role_env(**extra)
        proc = await spawn(f"{self.label}-{name}", "handler", argv, env, self.logs)
        self.procs.append(proc)
        await wait_http(f"{scheme}://127.0.0.1:{port}/readyz", proc, tls=probe)
        self.servers.book.add(name, proc.pid)
        self.role_names.append(name)
        self.handler_pids[name] = proc.pid
        return f"{scheme}://127.0.0.1:{port}/handle"

    async def start_consumer(self, durable: str, handler_url: str, replica: int = 1) -> Proc:
        """Start one inbox-consumer replica of ``durable`` calling ``handler_url``."""
        argv = [PYTHON, "-m", "services.inbox_consumer", "--durable", durable]
        name = f"consumer-{durable}-{replica}"
        extra = {"FERRY_HANDLER_URL": handler_url}
        if self.tls is not None:
            extra["FERRY_HANDLER_TLS_CA"] = str(self.tls.ca)
        return await self._start(name, "consumer", argv, **extra)

    async def start_publisher(self, context: str) -> Proc:
        """Start the outbox-publisher of ``context``."""
        argv = [PYTHON, "-m", "services.outbox_publisher", "--context", context]
        return await self._start(f"publisher-{context}", "publisher", argv)

    async def start_retention(self, every: float) -> Proc:
        """Start the retention role: ``ferry purge --every`` (as the superuser here)."""
        argv = [PYTHON, "-m", "shared.cli", "purge", "--every", f"{every:g}"]
        return await self._start("retention", "retention", argv)

    async def stop_roles(self) -> dict[str, int]:
        """Stop every role (SIGTERM, drain) and return their exit codes."""
        codes = {}
        for proc in reversed(self.procs):
            codes[proc.name] = await proc.stop()
        for name in self.role_names:
            self.servers.book.forget(name)
        self.procs.clear()
        self.role_names.clear()
        return codes
