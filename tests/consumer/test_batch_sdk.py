"""Batch calls from the real consumer to Ferry's real example handler (the SDK, one
transaction per batch with a savepoint per event), fault injection on: every event is
applied exactly once, counted in the handler's own tables, against what was published."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import DURABLE, RunningConsumer, envelope, fast_durable, publish
from tests.consumer.hostile import until_all
from tests.observability.conftest import handler_app

pytestmark = pytest.mark.integration


async def _count(env: Env, sql: str, *args: object) -> int:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


async def test_batches_to_the_sdk_handler_apply_each_event_exactly_once(env: Env, nc: NATS) -> None:
    async with handler_app(env, "sea", fault_injection=True) as app:
        fast_durable(env, app.url, max_deliver=5, backoff=["200ms"] * 4)
        env.doc["durables"][DURABLE]["handler"]["batch"] = 8
        env.write()
        await provision(nc.jetstream(), env.topology, caps=CAPS)
        normal = [envelope(vibe_id=f"n{i}") for i in range(20)]
        flaky = [envelope(vibe_id=f"f{i}", _ferry_test={"fail_attempts": 1}) for i in range(3)]
        poison = [envelope(vibe_id=f"p{i}", _ferry_test={"poison": True}) for i in range(2)]
        for event in [*normal, *flaky, *poison]:
            await publish(nc, event)
        async with RunningConsumer(env, nc, app.url) as consumer:
            await until_all(env, [e.message_id for e in [*normal, *flaky]])
            await until_all(env, [e.message_id for e in poison], "failed")
            # A crash between the handler's commit and the inbox mark: the inbox row is
            # gone, the event comes again; the handler's claim answers it 409 in its batch.
            again = normal[0]
            conn = await asyncpg.connect(env.dsn("sea"))
            try:
                await conn.execute(
                    "DELETE FROM inbox_messages WHERE durable = $1 AND message_id = $2",
                    DURABLE,
                    uuid.UUID(again.message_id),
                )
            finally:
                await conn.close()
            await publish(nc, again, msg_id=str(uuid.uuid4()))
            await until_all(env, [again.message_id])
            calls = consumer.stats.handler_calls
    applied = [*normal, *flaky]
    # Exactly once, counted in the handler's own database.
    assert await _count(env, "SELECT count(*) FROM handler_sea_vibes") == len(applied)
    assert await _count(env, "SELECT count(*) FROM handler_applied WHERE handler = 'sea'") == len(
        applied
    )
    per_id = await _count(
        env,
        "SELECT count(*) FROM (SELECT message_id FROM handler_calls WHERE status = 200"
        " GROUP BY message_id HAVING count(*) > 1) twice",
    )
    assert per_id == 0
    assert await _count(env, "SELECT count(*) FROM handler_calls WHERE status = 200") == len(
        applied
    )
    # The redelivered event was answered 409 (nothing applied again); the flaky ones 503.
    assert (
        await _count(
            env,
            "SELECT count(*) FROM handler_calls WHERE status = 409 AND message_id = $1",
            uuid.UUID(normal[0].message_id),
        )
        == 1
    )
    assert await _count(env, "SELECT count(*) FROM handler_calls WHERE status = 503") == len(flaky)
    assert await _count(env, "SELECT count(*) FROM handler_calls WHERE status = 422") == len(poison)
    # Fewer POSTs than events.
    assert calls < len(applied) + len(poison)
