"""Fixtures of the KPI job tests: one SparkSession per test session, fresh databases per test.

The SparkSession is built by the job's own :func:`spark.session.build_session` with two
local cores, two shuffle partitions and no UI, once: a JVM start costs seconds. Each test
gets the sea-vibespro topology on freshly created and migrated databases of the session's
real PostgreSQL (no NATS: the tests write the rows the platform would have written).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from pyspark.sql import SparkSession

from devstack.postgres import PostgresServer
from shared.access.identities import identity_named
from shared.adapters.postgres import migrate_database
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from spark.session import build_session, prepare_java
from spark.settings import KpiSettings
from tests.conftest import ROOT, Env, sea_vibespro_doc

#: A short-lived JVM on tiny data: C1 only (C2's compile time never pays back in a test).
QUICK_JVM = "-Duser.timezone=UTC -XX:TieredStopAtLevel=1"
#: Settings every test's job runs with: small, fast, local.
FAST: dict[str, Any] = {
    "kpi_master": "local[2]",
    "kpi_shuffle_partitions": 2,
    "kpi_read_partitions": 4,
    "kpi_spark_conf": {"spark.driver.extraJavaOptions": QUICK_JVM},
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test session."""
    settings = KpiSettings(**FAST)
    prepare_java(settings)
    session = build_session(settings)
    try:
        yield session
    finally:
        session.stop()


class KpiWorld:
    """One test's topology file and databases."""

    def __init__(self, tmp_path: Path, pg: PostgresServer, doc: dict[str, Any]) -> None:
        self.tmp_path, self.pg, self.doc = tmp_path, pg, doc
        self.path = tmp_path / "topology.yaml"
        self.path.write_text(yaml.safe_dump(doc))
        self.topology: Topology = load_topology(self.path)
        self.report_dir = tmp_path / "reports"

    def database(self, context: str) -> str:
        """Database name of ``context``."""
        return self.topology.contexts[context].database

    def dsn(self, context: str) -> str:
        """DSN of ``context``'s database."""
        return self.pg.dsn(self.database(context))

    def databases(self) -> dict[str, str]:
        """Database → DSN, as FERRY_DATABASES wants it."""
        return {db: self.pg.dsn(db) for db in self.topology.databases()}

    def settings(self, **overrides: Any) -> KpiSettings:
        """Job settings for this world (fast Spark, reports under tmp_path)."""
        values: dict[str, Any] = {
            "topology": self.path,
            "databases": self.databases(),
            "kpi_report_dir": self.report_dir,
            **FAST,
        }
        values.update(overrides)
        return KpiSettings(**values)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a job subprocess."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        env.update(
            FERRY_TOPOLOGY=str(self.path),
            FERRY_DATABASES=json.dumps(self.databases()),
            FERRY_KPI_REPORT_DIR=str(self.report_dir),
            FERRY_KPI_MASTER="local[2]",
            FERRY_KPI_SHUFFLE_PARTITIONS="2",
            FERRY_KPI_SPARK_CONF=json.dumps(FAST["kpi_spark_conf"]),
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def role_databases(self, role: str) -> dict[str, str]:
        """Grant every role of the topology its access (shared.access.db_roles, as in production)
        and return database → DSN as ``role``'s own login, its password in a passfile."""
        helper = Env(self.tmp_path, self.pg, "nats://unused", self.doc)
        asyncio.run(helper.grant_roles())
        identity = identity_named([self.topology], role)
        return {db: helper.role_dsn(identity, db) for db in self.topology.databases()}

    def fetch(self, context: str, sql: str, *args: Any) -> list[dict[str, Any]]:
        """Run a query on ``context``'s database."""

        async def go() -> list[dict[str, Any]]:
            conn = await asyncpg.connect(self.dsn(context))
            try:
                return [dict(r) for r in await conn.fetch(sql, *args)]
            finally:
                await conn.close()

        return asyncio.run(go())

    def execute(self, context: str, sql: str, *args: Any) -> None:
        """Run a statement on ``context``'s database."""

        async def go() -> None:
            conn = await asyncpg.connect(self.dsn(context))
            try:
                await conn.execute(sql, *args)
            finally:
                await conn.close()

        asyncio.run(go())


def make_world(
    tmp_path: Path, pg: PostgresServer, *, only_model_published: bool, keyed: bool = False
) -> KpiWorld:
    """Fresh, migrated databases for the sea-vibespro topology (``keyed``: vibespro__from_sea
    declared ``ordering: key`` with ``on_dead_letter: hold``, so it parks, and the job reads
    its parked messages)."""
    doc = sea_vibespro_doc("k" + uuid.uuid4().hex[:10])
    if only_model_published:
        # vibespro subscribes to model_published only, so other SEA events have no durable.
        doc["durables"]["vibespro__from_sea"]["filter_subjects"] = ["sea.event.model_published.>"]
    if keyed:
        doc["durables"]["vibespro__from_sea"].update(ordering="key", on_dead_letter="hold")
    world = KpiWorld(tmp_path, pg, doc)

    async def migrate() -> None:
        for dsn in world.databases().values():
            await asyncio.wait_for(migrate_database(dsn), timeout=60)

    asyncio.run(migrate())
    return world


@pytest.fixture
def world(tmp_path: Path, pg_server: PostgresServer) -> KpiWorld:
    """The sea-vibespro topology (vibespro subscribed to model_published only), migrated."""
    return make_world(tmp_path, pg_server, only_model_published=True)
