"""Fixtures that start REAL servers: nats-server (JetStream, file store) and PostgreSQL.

Nothing here is mocked. PostgreSQL starts once per session (each test gets a fresh,
migrated database); nats-server starts per test, on a free port with its own store
directory, so streams never leak between tests. Tests that crash a server start their
own instance. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from shared.adapters.postgres import migrate_database
from shared.provision import Caps
from shared.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[1]
#: Speed over durability for the test PostgreSQL: the OS never crashes in a test.
FAST_PG = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
#: A single test server holds one replica; JetStream reserves max_bytes, so keep it small.
CAPS = Caps(max_replicas=1, max_bytes=256 * 1000**2)
#: For a server a test SIGKILLs: an acknowledged commit must survive the process dying.
CRASHABLE_PG = {"fsync": "off"}


@contextmanager
def postgres(prefix: str, settings: dict[str, str] = FAST_PG) -> Iterator[PostgresServer]:
    """A PostgreSQL in its own directory, which its unprivileged user can reach when we are root.

    pytest's tmp_path lives under a 0700 directory of root's; PostgreSQL refuses to run as
    root and runs as a system user instead (devstack.postgres), so it needs a path of its own.
    """
    base = Path(tempfile.mkdtemp(prefix=f"ferry-{prefix}-"))
    base.chmod(0o711)
    server = PostgresServer(base / "data", extra_settings=settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session."""
    with postgres("pg") as server:
        yield server


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream for one test."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A plain client connection to the test's nats-server."""
    client = await asyncio.wait_for(nats.connect(nats_server.url), timeout=10)
    try:
        yield client
    finally:
        await client.close()


def sea_vibespro_doc(prefix: str) -> dict[str, Any]:
    """The shipped sea-vibespro topology, with databases renamed for one test."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/sea-vibespro.yaml").read_text())
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    return doc


class Env:
    """One test's world: its topology file, its databases, its NATS."""

    def __init__(self, tmp_path: Path, pg: PostgresServer, nats_url: str, doc: dict[str, Any]):
        self.tmp_path, self.pg, self.nats_url, self.doc = tmp_path, pg, nats_url, doc
        self.path = tmp_path / "topology.yaml"
        self.write()

    def write(self) -> Topology:
        """(Re)write the topology file from ``self.doc`` and load it."""
        self.path.write_text(yaml.safe_dump(self.doc))
        self.topology = load_topology(self.path)
        return self.topology

    def dsn(self, context: str) -> str:
        """DSN of a context's database."""
        return self.pg.dsn(self.topology.contexts[context].database)

    def settings_env(self, **extra: str) -> dict[str, str]:
        """Environment for a role subprocess."""
        databases = {c.database: self.pg.dsn(c.database) for c in self.topology.contexts.values()}
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        env.update(
            FERRY_TOPOLOGY=str(self.path),
            FERRY_NATS_URL=self.nats_url,
            FERRY_DATABASES=json.dumps(databases),
            FERRY_MAX_STREAM_REPLICAS="1",
            FERRY_MAX_STREAM_BYTES="256MB",
            FERRY_LOG_LEVEL="INFO",
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env


@pytest.fixture
async def env(tmp_path: Path, pg_server: PostgresServer, nats_server: NatsServer) -> Env:
    """The sea-vibespro topology on fresh, migrated databases and a fresh NATS."""
    prefix = "t" + uuid.uuid4().hex[:10]
    world = Env(tmp_path, pg_server, nats_server.url, sea_vibespro_doc(prefix))
    for database in world.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    return world


@pytest.fixture
async def sea_conn(env: Env) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the test's sea database."""
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        yield conn
    finally:
        await conn.close()


PYTHON = sys.executable
