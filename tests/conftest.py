"""Fixtures that start REAL servers: nats-server (JetStream, file store) and PostgreSQL.

Nothing here is mocked. PostgreSQL starts once per session (each test gets a fresh,
migrated database); nats-server starts per test, on a free port with its own store
directory, so streams never leak between tests. Tests that crash a server start their
own instance. Every wait is bounded.

Authentication is on, as in production: nats-server knows one user per role of the
shipped topologies (permissions from :mod:`shared.access.nats_auth`) plus the admin, and each
test database grants every role exactly its access (:mod:`shared.access.db_roles`). Test code
and operator commands use the admin (``nc``, ``Env.settings_env()``); a role process a
test starts gets its own credentials (``Env.settings_env(command=argv)``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer, tls_block
from devstack.postgres import PostgresServer, ServerTLS, system_postgres
from devstack.tls import stack_certificates
from shared.access.db_apply import apply_roles
from shared.access.identities import (
    NATS_ADMIN,
    Identity,
    SecretsDir,
    identity_named,
    write_private,
)
from shared.access.nats_auth import DevAccess
from shared.access.streams import Caps
from shared.adapters.nats import NatsAuth
from shared.adapters.postgres import migrate_database
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.runtime.settings import ConsumerSettings, PublisherSettings
from tests.first_run import DemoRun, run_first_demo

ROOT = Path(__file__).resolve().parents[1]
#: Speed over durability for the test PostgreSQL: the OS never crashes in a test.
FAST_PG = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
#: A single test server holds one replica; JetStream reserves max_bytes, so keep it small.
CAPS = Caps(max_replicas=1, max_bytes=256 * 1000**2)
#: For a server a test SIGKILLs: an acknowledged commit must survive the process dying.
CRASHABLE_PG = {"fsync": "off"}
#: Topologies whose roles are NATS users of every test server (tests rename databases only).
AUTH_TOPOLOGIES = ("topologies/sea-vibespro.yaml", "topologies/mediation.yaml")
#: The session's role passwords (NATS users and PostgreSQL logins), one file each.
SECRETS = SecretsDir(Path(tempfile.mkdtemp(prefix="ferry-secrets-")))
atexit.register(shutil.rmtree, SECRETS.root, True)
#: The users of each running test nats-server, by URL (Env finds its credentials here).
NATS_ACCESS: dict[str, DevAccess] = {}
#: The session's CA and server certificates (issue 47): the test nats-server requires TLS
#: of every client, as the dev stack's does; clients verify it with ``TLS.ca``.
TLS = stack_certificates(Path(tempfile.mkdtemp(prefix="ferry-tls-")))
atexit.register(shutil.rmtree, TLS.folder, True)


@cache
def _auth_topologies() -> tuple[Topology, ...]:
    return tuple(load_topology(ROOT / path) for path in AUTH_TOPOLOGIES)


def nats_access(*, tls: bool = True) -> DevAccess:
    """Users and passwords of a test nats-server: every shipped role plus the admin; with
    ``tls`` (a server started with :func:`nats_tls_block`) its clients verify it by the
    session's CA."""
    return DevAccess.create(list(_auth_topologies()), SECRETS.root, TLS.ca if tls else None)


def nats_tls_block() -> str:
    """The ``tls`` block of a test nats-server: clients must speak TLS (its certificate for
    the loopback names, from the session's CA)."""
    return tls_block(TLS.nats.cert, TLS.nats.key, TLS.ca)


def admin_settings(nats_url: str) -> dict[str, Any]:
    """Settings fields (``nats_user``, ``nats_password_file``) of the admin of a test server."""
    access = NATS_ACCESS[nats_url]
    return {
        "nats_user": NATS_ADMIN,
        "nats_password_file": access.password_file(NATS_ADMIN),
        "nats_tls_ca": access.tls_ca,
    }


def admin_auth(server: NatsServer) -> NatsAuth:
    """The admin's credentials on ``server`` (provisioning, test assertions)."""
    assert server.access is not None, "this nats-server runs without authentication"
    return server.access.auth(NATS_ADMIN)


def tls_postgres() -> Path:
    """The system's PostgreSQL built with TLS (Debian's; ``./dev setup`` installs it), the
    one the dev stack runs: nothing is skipped for want of it."""
    found = system_postgres()
    assert found is not None, (
        "no PostgreSQL built with TLS: ./dev setup installs Debian's postgresql-15 "
        "(the embedded wheel's server has no TLS)"
    )
    return found


@contextmanager
def postgres(prefix: str, settings: dict[str, str] = FAST_PG) -> Iterator[PostgresServer]:
    """A PostgreSQL in its own directory, which its unprivileged user can reach when we are root.

    pytest's tmp_path lives under a 0700 directory of root's; PostgreSQL refuses to run as
    root and runs as a system user instead (devstack.postgres), so it needs a path of its own.
    It runs as the dev stack's does (issue 47): the system's server with TLS, role logins
    over TLS only (:meth:`Env.role_dsn` asks for ``verify-full``); the superuser, which
    the tests use to set up, is trusted on loopback.
    """
    base = Path(tempfile.mkdtemp(prefix=f"ferry-{prefix}-"))
    base.chmod(0o711)
    server = PostgresServer(
        base / "data",
        extra_settings=settings,
        bin_dir=tls_postgres(),
        tls=ServerTLS(TLS.postgres.cert, TLS.postgres.key, TLS.ca),
    )
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


@pytest.fixture(scope="session")
def first_run() -> Iterator[DemoRun]:
    """The README's first run (``devstack.stack up --demo``), once per session: see
    tests/first_run.py. Its data directory lives until the session ends."""
    base = Path(tempfile.mkdtemp(prefix="ferry-first-run-"))
    base.chmod(0o755)  # the unprivileged PostgreSQL user must reach <var>/pg when we are root
    try:
        yield run_first_demo(base / "var")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream, per-role authorization and TLS for one test."""
    server = NatsServer(tmp_path / "nats", access=nats_access(), extra=nats_tls_block())
    server.start()
    assert server.access is not None
    NATS_ACCESS[server.url] = server.access
    try:
        yield server
    finally:
        NATS_ACCESS.pop(server.url, None)
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A plain client connection to the test's nats-server, as the admin."""
    options = admin_auth(nats_server).options([nats_server.url])
    client = await asyncio.wait_for(nats.connect(nats_server.url, **options), timeout=10)
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

    async def grant_roles(self, *databases: str) -> None:
        """Create every role login of this topology and grant it its access in ``databases``
        (default: all of them)."""
        await apply_roles(
            [self.topology], self.pg.dsn, _pg_password, owner=False, databases=databases or None
        )

    def role_dsn(self, identity: Identity, database: str) -> str:
        """DSN of ``database`` as ``identity``'s login (its password in a passfile)."""
        path = SECRETS.pgpass_file(identity.name)
        if not path.exists():
            write_private(path, f"*:*:*:{identity.pg_role}:{_pg_password(identity.name)}\n")
        parts = urlsplit(self.pg.dsn(database))
        netloc = f"{identity.pg_role}@{parts.netloc.rsplit('@', 1)[-1]}"
        query = f"passfile={path}"
        if self.pg.tls is not None:  # role logins come over TLS only, the server verified
            query += f"&sslmode=verify-full&sslrootcert={self.pg.tls.ca}"
        return urlunsplit(parts._replace(netloc=netloc, query=query))

    def settings_env(
        self, *, command: Sequence[str] | None = None, role: str | None = None, **extra: str
    ) -> dict[str, str]:
        """Environment for a subprocess: the admin's credentials, or with ``role`` (or a
        ``command`` that runs a role) that role's own NATS user and database login."""
        if role is None and command is not None:
            role = role_of_command(command, extra, self.topology)
        identity = None if role is None else identity_named([self.topology], role)
        databases = {c.database: self.pg.dsn(c.database) for c in self.topology.contexts.values()}
        if identity is not None:
            databases = {db: self.role_dsn(identity, db) for db in databases}
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        access = NATS_ACCESS.get(self.nats_url)
        if access is not None and (identity is None or identity.uses_nats):
            env.update(access.env(NATS_ADMIN if identity is None else identity.name))
        env.update(
            FERRY_TOPOLOGY=str(self.path),
            FERRY_NATS_URL=self.nats_url,
            FERRY_DATABASES=json.dumps(databases),
            # A single test server holds one replica; a cluster's seed list keeps 3.
            FERRY_MAX_STREAM_REPLICAS="3" if "," in self.nats_url else "1",
            FERRY_MAX_STREAM_BYTES="256MB",
            FERRY_LOG_LEVEL="INFO",
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env


def _pg_password(name: str) -> str:
    return SECRETS.ensure(SECRETS.pg_password_file(name))


def role_of_command(
    command: Sequence[str], extra: dict[str, str], topology: Topology
) -> str | None:
    """The role identity a ``python -m services.X ...`` command runs as (None: not a role)."""
    argv = list(command)
    if "-m" not in argv:
        return None
    module, args = argv[argv.index("-m") + 1], argv[argv.index("-m") + 2 :]

    def option(flag: str, variable: str, default: str) -> str:
        if flag in args:
            return args[args.index(flag) + 1]
        return extra.get(variable, default)

    if module == "services.outbox_publisher":
        default = str(PublisherSettings.model_fields["context"].default)
        return f"outbox-publisher-{option('--context', 'FERRY_CONTEXT', default)}"
    if module == "services.inbox_consumer":
        default = str(ConsumerSettings.model_fields["durable"].default)
        return f"inbox-consumer-{option('--durable', 'FERRY_DURABLE', default)}"
    if module in ("services.dlq_router", "services.dlq_replayer"):
        return f"{module.split('.')[1].replace('_', '-')}-{topology.name}"
    if module == "services.handlers":
        return f"handler-{option('--service', 'FERRY_SERVICE', '')}"
    return None


@pytest.fixture
async def env(tmp_path: Path, pg_server: PostgresServer, nats_server: NatsServer) -> Env:
    """The sea-vibespro topology on fresh, migrated databases and a fresh NATS."""
    prefix = "t" + uuid.uuid4().hex[:10]
    world = Env(tmp_path, pg_server, nats_server.url, sea_vibespro_doc(prefix))
    for database in world.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await asyncio.wait_for(world.grant_roles(), timeout=60)
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


def ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """``ferry ARGS`` as an operator runs it: a process of its own, with ``env``'s settings."""
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT,
        env=env.settings_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
