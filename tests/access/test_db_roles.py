"""Per-role PostgreSQL logins on a real server: each can do what its statements need, no more.

The ``env`` fixture grants every role of the topology (``shared.access.db_roles``) in the test's
databases; the cluster asks every non-superuser for its SCRAM password
(devstack/postgres.py), so these logins are checked the way production checks them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

from shared.access.db_apply import scram_verifier
from shared.access.identities import DB_OWNER, Identity
from shared.adapters import outbox
from shared.adapters.producer import record_event
from tests.conftest import PYTHON, ROOT, Env, postgres
from tests.helpers import insert_events

pytestmark = pytest.mark.integration

DENIED = asyncpg.exceptions.InsufficientPrivilegeError


@asynccontextmanager
async def login(env: Env, kind: str, of: str, context: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to ``context``'s database as the login of role ``kind-of``."""
    identity = Identity(kind, of)  # type: ignore[arg-type]
    conn = await asyncpg.connect(env.role_dsn(identity, env.topology.contexts[context].database))
    try:
        yield conn
    finally:
        await conn.close()


async def _produce(conn: asyncpg.Connection) -> None:
    """Record one sea event through the producer API, in its own transaction."""
    async with conn.transaction():
        await record_event(
            conn,
            aggregate_type="model",
            aggregate_id="m1",
            event_type="model_published",
            payload={"model_id": "m1", "name": "n"},
        )


async def _inbox_row(conn: asyncpg.Connection, durable: str) -> uuid.UUID:
    message_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO inbox_messages (message_id, durable, subject) VALUES ($1, $2, 's.e.x.v1')",
        message_id,
        durable,
    )
    return message_id


async def test_publisher_reads_and_marks_the_outbox_and_nothing_else(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    await insert_events(sea_conn, 3)
    async with login(env, "outbox-publisher", "sea", "sea") as pub:
        async with pub.transaction():
            rows = (await outbox.claim(pub, 10)).rows  # FOR UPDATE SKIP LOCKED, as the role
            await outbox.mark_published(pub, [r.seq for r in rows])
        assert len(rows) == 3
        with pytest.raises(DENIED):
            await pub.execute("DELETE FROM outbox_events")
        with pytest.raises(DENIED):  # only the four publish columns
            await pub.execute("UPDATE outbox_events SET payload = '{}'::jsonb")
        with pytest.raises(DENIED):
            await _produce(pub)
        with pytest.raises(DENIED):
            await pub.fetch("SELECT * FROM inbox_messages")
        with pytest.raises(DENIED):
            await pub.execute("CREATE TABLE rogue (x int)")
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 3


async def test_a_login_cannot_reach_another_contexts_database(env: Env) -> None:
    vibespro = env.topology.contexts["vibespro"].database
    for identity in (
        Identity("outbox-publisher", "sea"),
        Identity("inbox-consumer", "sea__from_vibespro"),
        Identity("handler", "sea"),
        Identity("producer", "sea"),
    ):
        with pytest.raises(DENIED, match="CONNECT"):
            await asyncpg.connect(env.role_dsn(identity, vibespro))


async def test_producer_only_inserts_events(env: Env, sea_conn: asyncpg.Connection) -> None:
    async with login(env, "producer", "sea", "sea") as producer:
        await _produce(producer)
        with pytest.raises(DENIED):
            await producer.fetch("SELECT * FROM outbox_events")
        with pytest.raises(DENIED):  # a producer cannot forge a "published" row
            await producer.execute(
                "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload,"
                " published_at) VALUES (gen_random_uuid(), 'a', 'b', 'c', '{}', now())"
            )
        with pytest.raises(DENIED):
            await producer.execute("DELETE FROM outbox_events")
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 1


async def test_consumer_sees_and_writes_only_its_own_durables_rows(
    env: Env, pg_server: object
) -> None:
    # mediation_g-like layout: two durables in one database; here, a second durable on sea.
    durable, other = "sea__from_vibespro", "vibespro__from_sea"
    admin = await asyncpg.connect(env.dsn("sea"))
    try:
        theirs = await _inbox_row(admin, other)
        async with login(env, "inbox-consumer", durable, "sea") as con:
            mine = await _inbox_row(con, durable)
            visible = {
                r["message_id"] for r in await con.fetch("SELECT message_id FROM inbox_messages")
            }
            assert visible == {mine}
            with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                await _inbox_row(con, other)  # row-level security: not its durable
            updated = await con.execute(
                "UPDATE inbox_messages SET attempts = 9 WHERE message_id = $1", theirs
            )
            assert updated == "UPDATE 0"
            with pytest.raises(DENIED):
                await con.execute("DELETE FROM inbox_messages")
            with pytest.raises(DENIED):
                await con.fetch("SELECT * FROM outbox_events")
        assert (
            await admin.fetchval(
                "SELECT attempts FROM inbox_messages WHERE message_id = $1", theirs
            )
            == 0
        )
    finally:
        await admin.close()


async def test_replayer_updates_but_never_inserts_and_kpi_only_reads(env: Env) -> None:
    admin = await asyncpg.connect(env.dsn("sea"))
    try:
        row = await _inbox_row(admin, "sea__from_vibespro")
    finally:
        await admin.close()
    async with login(env, "dlq-replayer", "sea-vibespro", "sea") as rep:
        assert (
            await rep.execute("UPDATE inbox_messages SET attempts = 2 WHERE message_id = $1", row)
            == "UPDATE 1"
        )
        with pytest.raises(DENIED):
            await _inbox_row(rep, "sea__from_vibespro")
    async with login(env, "kpi-spark-job", "sea-vibespro", "sea") as kpi:
        assert await kpi.fetchval("SELECT count(*) FROM inbox_messages") == 1
        await kpi.execute("DELETE FROM kpi_runs")  # its own results
        with pytest.raises(DENIED):
            await kpi.execute("UPDATE inbox_messages SET attempts = 3")
        with pytest.raises(DENIED):
            await kpi.execute("UPDATE outbox_events SET publish_error = 'x'")


async def test_retention_only_reads_and_deletes_outbox_and_inbox_rows(
    env: Env, sea_conn: asyncpg.Connection
) -> None:
    await insert_events(sea_conn, 2)
    await _inbox_row(sea_conn, "sea__from_vibespro")
    async with login(env, "retention", "sea-vibespro", "sea") as purger:
        assert await purger.execute("DELETE FROM outbox_events") == "DELETE 2"
        assert await purger.execute("DELETE FROM inbox_messages") == "DELETE 1"
        with pytest.raises(DENIED):
            await purger.execute("UPDATE outbox_events SET publish_error = 'x'")
        with pytest.raises(DENIED):
            await purger.execute("UPDATE inbox_messages SET attempts = 1")
        with pytest.raises(DENIED):
            await _inbox_row(purger, "sea__from_vibespro")
        with pytest.raises(DENIED):
            await _produce(purger)
        with pytest.raises(DENIED):  # it deletes settled dead letters, never changes one
            await purger.execute("UPDATE dead_letters SET status = 'discarded'")
        with pytest.raises(DENIED):
            await purger.execute("DELETE FROM kpi_watermarks")
        with pytest.raises(DENIED):
            await purger.execute("UPDATE kpi_runs SET verdict = 'x'")


async def test_handler_owns_its_tables_and_only_a_forwarder_writes_the_outbox(env: Env) -> None:
    async with login(env, "handler", "sea", "sea") as handler:
        await handler.execute("CREATE TABLE IF NOT EXISTS handler_probe (x int)")
        await handler.execute("INSERT INTO handler_probe VALUES (1)")
        with pytest.raises(DENIED):  # the sea handler forwards nothing
            await _produce(handler)
        with pytest.raises(DENIED):
            await handler.fetch("SELECT * FROM inbox_messages")


async def test_wrong_password_is_refused(env: Env, tmp_path: Path) -> None:
    identity = Identity("outbox-publisher", "sea")
    dsn = env.role_dsn(identity, env.topology.contexts["sea"].database)
    passfile = tmp_path / "wrong.pgpass"
    passfile.write_text(f"*:*:*:{identity.pg_role}:not-the-password\n")
    passfile.chmod(0o600)
    with pytest.raises(asyncpg.exceptions.InvalidPasswordError):
        await asyncpg.connect(dsn.split("?")[0] + f"?passfile={passfile}")


def test_scram_verifier_matches_postgres_format() -> None:
    verifier = scram_verifier("secret", salt=b"0123456789abcdef")
    assert verifier.startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
    assert "secret" not in verifier


async def test_db_roles_command_then_migrations_as_the_owner(tmp_path: Path) -> None:
    """``ferry db-roles`` on a fresh cluster, then ``ferry migrate`` as the owner login."""
    secrets = tmp_path / "secrets"
    with postgres("roles") as pg:
        admin_env = {
            "FERRY_TOPOLOGY": str(ROOT / "topologies/sea-vibespro.yaml"),
            "FERRY_DSN_TEMPLATE": pg.dsn("{database}"),
            "PATH": "/usr/bin:/bin",
        }

        def ferry(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [PYTHON, "-m", "shared.cli", *args],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        # Before the databases exist: a clear refusal, then the logins only.
        refused = await asyncio.to_thread(
            ferry, "db-roles", "--passwords-dir", str(secrets), "--generate", env=admin_env
        )
        assert refused.returncode == 2 and "--logins-only" in refused.stderr, refused.stderr
        first = await asyncio.to_thread(
            ferry, "db-roles", "--passwords-dir", str(secrets), "--logins-only", env=admin_env
        )
        assert first.returncode == 0, first.stderr
        owner_pw = (secrets / f"pg-password-{DB_OWNER}").read_text().strip()
        owner_dsn = pg.dsn("{database}").replace("postgres@", f"{DB_OWNER}:{owner_pw}@")
        owner_env = {**admin_env, "FERRY_DSN_TEMPLATE": owner_dsn}
        migrated = await asyncio.to_thread(ferry, "migrate", "--json", env=owner_env)
        assert migrated.returncode == 0, migrated.stderr
        granted = await asyncio.to_thread(
            ferry, "db-roles", "--passwords-dir", str(secrets), "--json", env=admin_env
        )
        assert granted.returncode == 0, granted.stderr
        assert "ferry_outbox_publisher_sea" in json.loads(granted.stdout)["sea"]
        for out in (first, migrated, granted):
            assert owner_pw not in out.stdout + out.stderr
        conn = await asyncpg.connect(pg.dsn("sea"))
        try:
            owners = {
                r["tableowner"]
                for r in await conn.fetch(
                    "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'"
                )
            }
        finally:
            await conn.close()
        assert owners == {DB_OWNER}
