"""outbox-publisher against real servers: once, in order, through crashes and restarts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from services.outbox_publisher.publisher import OutboxPublisher
from shared.access.streams import provision
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import migrate_database
from shared.adapters.producer import record_event
from tests.conftest import (
    CAPS,
    CRASHABLE_PG,
    ROOT,
    Env,
    admin_auth,
    postgres,
    sea_vibespro_doc,
)
from tests.helpers import (
    RunningPublisher,
    eventually,
    insert_events,
    stream_count,
    stream_messages,
)

pytestmark = pytest.mark.integration
STREAM = "SEA_EVENTS"


async def _unpublished(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL"))


async def _assert_exactly_once_in_order(nc: NATS, conn: asyncpg.Connection) -> None:
    """Every outbox row is in the stream exactly once, in per-aggregate seq order."""
    rows = await conn.fetch("SELECT id::text, aggregate_id, seq FROM outbox_events ORDER BY seq")
    msgs = await stream_messages(nc.jetstream(), STREAM)
    ids = [m.msg_id for m in msgs]
    assert len(ids) == len(set(ids)), "an event id appears twice in the stream"
    assert sorted(ids) == sorted(r["id"] for r in rows), "stream and outbox disagree"
    expected: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        expected[r["aggregate_id"]].append(r["id"])
    seen: dict[str, list[str]] = defaultdict(list)
    for m in msgs:
        seen[m.body["aggregate_id"]].append(m.msg_id)
    assert seen == expected, "per-aggregate order differs from outbox order"


async def test_publishes_with_msg_id_subject_and_envelope(env: Env, nc: NATS) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    # A declared version above 1 (the producer refuses versions the manifests lack).
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="vibe",
                aggregate_id="v1",
                event_type="vibe_created",
                event_version=2,
                payload={"vibe_id": "v1", "title": "x", "owner_id": "u1"},
                correlation_id="6f1c1e38-9d7c-4c65-9a8e-2b8f3fa0a001",
                traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
        async with RunningPublisher(env.topology, "vibespro", env.dsn("vibespro"), nc.jetstream()):
            await eventually(lambda: _is_zero(conn), timeout=10, what="row published")
        row = await conn.fetchrow("SELECT publish_attempts, publish_error FROM outbox_events")
    finally:
        await conn.close()
    [msg] = await stream_messages(nc.jetstream(), "VIBESPRO_EVENTS")
    assert msg.subject == "vibespro.event.vibe_created.v2"
    assert msg.msg_id == str(event_id)
    assert msg.headers["traceparent"].startswith("00-0af7651916cd43dd")
    assert msg.body["message_id"] == str(event_id)
    assert msg.body["event_version"] == 2 and msg.body["payload"]["title"] == "x"
    assert msg.body["correlation_id"] == "6f1c1e38-9d7c-4c65-9a8e-2b8f3fa0a001"
    assert msg.body["payload_digest"].startswith("sha256:")
    assert (row["publish_attempts"], row["publish_error"]) == (1, None)


async def _is_zero(conn: asyncpg.Connection) -> bool:
    return await _unpublished(conn) == 0


async def test_late_committing_transaction_is_still_published(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    late = await asyncpg.connect(env.dsn("sea"))
    try:
        tx = late.transaction()
        await tx.start()
        late_id = await record_event(  # takes the lower seq, commits last
            late,
            aggregate_type="model",
            aggregate_id="late",
            event_type="model_published",
            payload={"model_id": "late", "name": "l"},
        )
        async with RunningPublisher(env.topology, "sea", env.dsn("sea"), nc.jetstream()):
            await insert_events(sea_conn, 20)
            await eventually(
                lambda: _count_is(nc, 20), timeout=10, what="the 20 early events in the stream"
            )
            await tx.commit()
            await eventually(lambda: _is_zero(sea_conn), timeout=10, what="late row published")
    finally:
        await late.close()
    ids = [m.msg_id for m in await stream_messages(nc.jetstream(), STREAM)]
    assert ids[-1] == str(late_id) and len(ids) == 21


async def _count_is(nc: NATS, expected: int) -> bool:
    return await stream_count(nc.jetstream(), STREAM) == expected


async def test_two_replicas_publish_everything_once_in_aggregate_order(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    js = nc.jetstream()
    async with (
        RunningPublisher(env.topology, "sea", env.dsn("sea"), js, batch_size=50, concurrency=3),
        RunningPublisher(env.topology, "sea", env.dsn("sea"), js, batch_size=50, concurrency=3),
    ):
        for _ in range(10):  # keep producing while both replicas drain
            await insert_events(sea_conn, 300, aggregates=7)
        await eventually(lambda: _is_zero(sea_conn), timeout=60, what="3000 rows published")
    assert await stream_count(js, STREAM) == 3000
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_a_worker_held_back_by_another_resumes_at_its_commit(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """A backlog over few aggregates: a worker's claim finds its rows behind an earlier row
    of their aggregate in another worker's batch. It waits for that batch's commit — not
    for a NOTIFY (a backlog brings none) nor the poll (a minute here) — and drains on."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await insert_events(sea_conn, 400, aggregates=3)
    js = nc.jetstream()
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), js, batch_size=20, concurrency=3, poll_interval=60
    ) as publisher:
        await eventually(lambda: _is_zero(sea_conn), timeout=40, what="400 rows published")
    assert publisher.stats.held_back >= 1
    assert publisher.stats.released >= 1
    assert publisher.stats.published == 400
    await _assert_exactly_once_in_order(nc, sea_conn)


@pytest.mark.parametrize("atomic_batches", [True, False], ids=["atomic", "one-by-one"])
async def test_stream_refusal_is_recorded_and_retried(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, atomic_batches: bool
) -> None:
    """With no stream, publishes fail: the rows keep their error and are published once it
    exists. One by one, only the head of the aggregate was sent (the rest waited behind
    it); an atomic batch sent all three, and each records the attempt. One worker: with two,
    a claim racing another may lock only some of the rows (the other's are held back)."""
    await insert_events(sea_conn, 3, aggregates=1)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), nc.jetstream(), concurrency=1,
        atomic_batches=atomic_batches, atomic_min_rows=1,
    ):  # fmt: skip
        await eventually(lambda: _has_error(sea_conn), timeout=10, what="publish_error recorded")
        row = await sea_conn.fetchrow(
            "SELECT publish_attempts, publish_error FROM outbox_events ORDER BY seq LIMIT 1"
        )
        assert row["publish_attempts"] >= 1 and row["publish_error"]
        attempted = await sea_conn.fetchval(
            "SELECT count(*) FROM outbox_events WHERE publish_attempts > 0"
        )
        assert attempted == (3 if atomic_batches else 1)
        await provision(nc.jetstream(), env.topology, caps=CAPS)
        await eventually(lambda: _is_zero(sea_conn), timeout=20, what="rows published after fix")
    await _assert_exactly_once_in_order(nc, sea_conn)


async def _has_error(conn: asyncpg.Connection) -> bool:
    return bool(
        await conn.fetchval("SELECT count(*) FROM outbox_events WHERE publish_error IS NOT NULL")
    )


def _spawn_publisher(env: Env, *, nats_url: str | None = None) -> subprocess.Popen[bytes]:
    extra = {"FERRY_CONTEXT": "sea", "FERRY_BATCH_SIZE": "50", "FERRY_POLL_INTERVAL": "0.2"}
    if nats_url:
        extra["FERRY_NATS_URL"] = nats_url
    with open(env.tmp_path / "publisher.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            argv := [sys.executable, "-m", "services.outbox_publisher"],
            cwd=ROOT,
            env=env.settings_env(command=argv, **extra),
            stdout=log,
            stderr=log,
        )


async def test_kill_between_puback_and_mark_publishes_each_id_once(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """SIGKILL the real process while its UPDATE is stuck after the PubAcks."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    # A trigger that stalls the publisher's mark, opening the PubAck-to-mark window wide.
    await sea_conn.execute(
        "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;"
        "CREATE TRIGGER stall BEFORE UPDATE ON outbox_events"
        " FOR EACH STATEMENT EXECUTE FUNCTION stall()"
    )
    await insert_events(sea_conn, 200, aggregates=20)
    proc = _spawn_publisher(env)
    try:
        await eventually(lambda: _count_is(nc, 50), timeout=30, what="first batch PubAcked")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await _unpublished(sea_conn) == 200, "the mark must not have happened"
    # The dead client's backend sleeps on in the trigger, holding its claim: end it.
    await sea_conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE query LIKE '%UPDATE outbox_events%' AND pid <> pg_backend_pid()"
    )
    await sea_conn.execute("DROP TRIGGER stall ON outbox_events")
    proc = _spawn_publisher(env)
    try:
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="all rows published")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert await stream_count(nc.jetstream(), STREAM) == 200
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_sigterm_drains_and_exits_zero(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    proc = _spawn_publisher(env)
    try:
        await insert_events(sea_conn, 2000, aggregates=50)
        await eventually(lambda: _stream_nonempty(nc), timeout=30, what="publisher running")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    # Whatever was marked published is in the stream; the rest waits for the next run.
    published = 2000 - await _unpublished(sea_conn)
    assert await stream_count(nc.jetstream(), STREAM) >= published


async def _stream_nonempty(nc: NATS) -> bool:
    return await stream_count(nc.jetstream(), STREAM) > 0


async def test_rides_out_a_nats_restart(
    env: Env, nats_server: NatsServer, sea_conn: asyncpg.Connection
) -> None:
    nc = await connect_nats(
        [nats_server.url], name="test", ping_interval=1, auth=admin_auth(nats_server)
    )
    try:
        await provision(nc.jetstream(), env.topology, caps=CAPS)
        proc = _spawn_publisher(env)
        try:
            await insert_events(sea_conn, 300, aggregates=10)
            await asyncio.to_thread(nats_server.kill)
            await insert_events(sea_conn, 300, aggregates=10)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(nats_server.restart)
            await insert_events(sea_conn, 300, aggregates=10)
            await eventually(lambda: _is_zero(sea_conn), timeout=60, what="900 rows published")
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 20)
        await eventually(lambda: _count_is(nc, 900), timeout=10, what="stream readable again")
        await _assert_exactly_once_in_order(nc, sea_conn)
    finally:
        await nc.close()


async def test_rides_out_a_postgres_crash(tmp_path: Path, nats_server: NatsServer) -> None:
    with postgres("crash", CRASHABLE_PG) as pg:
        world = Env(tmp_path, pg, nats_server.url, sea_vibespro_doc("crash"))
        await migrate_database(world.dsn("sea"))
        await world.grant_roles(world.topology.contexts["sea"].database)
        nc = await connect_nats([nats_server.url], name="test", auth=admin_auth(nats_server))
        await provision(nc.jetstream(), world.topology, caps=CAPS)
        proc = _spawn_publisher(world)
        try:
            await _insert_with_fresh_connection(world.dsn("sea"), 300)
            await asyncio.to_thread(pg.kill)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(pg.restart)
            await _insert_with_fresh_connection(world.dsn("sea"), 300)
            conn = await asyncpg.connect(world.dsn("sea"))
            await eventually(lambda: _is_zero(conn), timeout=60, what="600 rows published")
            await _assert_exactly_once_in_order(nc, conn)
            await conn.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 20)
            await nc.close()


async def _insert_with_fresh_connection(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await insert_events(conn, count, aggregates=10)
    finally:
        await conn.close()


def test_entry_point_refuses_unknown_context(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        FERRY_TOPOLOGY=str(ROOT / "topologies/sea-vibespro.yaml"),
        FERRY_CONTEXT="nope",
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-m", "services.outbox_publisher"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert b"no context 'nope'" in result.stderr


async def test_a_batch_that_raises_rolls_its_claim_back(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """The claim's transaction is ended on any error: rows stay pending, the connection clean."""
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await insert_events(sea_conn, 5)
    pool = await asyncpg.create_pool(env.dsn("sea"), min_size=1, max_size=1)
    try:
        ctx = env.topology.contexts["sea"]
        assert ctx.stream is not None
        publisher = OutboxPublisher(
            pool=pool, js=nc.jetstream(), context="sea", namespace=ctx.namespace,
            stream=ctx.stream.name, batch_size=10, publish_timeout=2.0,
        )  # fmt: skip

        async def broken(rows: object) -> tuple[list[int], dict[int, str]]:
            raise RuntimeError("publishing blew up")

        publisher.publish_rows = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="blew up"):
            await publisher.publish_batch()
        assert await _unpublished(sea_conn) == 5
        async with pool.acquire() as conn:  # the only connection: not left in a transaction
            assert not conn.is_in_transaction()
        del publisher.publish_rows  # the real method again
        assert await publisher.publish_batch() == (5, 0, 0)
    finally:
        await pool.close()
    assert await _unpublished(sea_conn) == 0
    await _assert_exactly_once_in_order(nc, sea_conn)
