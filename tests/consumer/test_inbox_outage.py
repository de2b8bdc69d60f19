"""An unreachable inbox database is back-pressure, not a failed delivery.

Found by the chaos suite: a consumer that nak'ed its batch whenever the inbox claim
failed spent a delivery per attempt, so an outage longer than the retry ladder
dead-lettered healthy events without ever calling the handler. The consumer's database
link here runs through a Toxiproxy-compatible proxy that is switched off for longer
than the whole ladder (4 deliveries, 200 ms apart).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from chaos.proxy import Proxy
from tests.conftest import Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    inbox_row,
    publish,
)
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def test_a_long_inbox_outage_holds_the_batch_and_loses_no_delivery(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    parts = urlsplit(world.dsn("sea"))
    proxy = Proxy("inbox", "127.0.0.1:0", f"{parts.hostname}:{parts.port}", random.Random(1))
    await proxy.enable()
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@{proxy.listen}"))
    try:
        async with RunningConsumer(world, nc, handler.url, dsn=via_proxy) as consumer:
            await proxy.disable()  # the database is gone before the message arrives
            event = envelope()
            await publish(nc, event)
            await eventually(
                lambda: _true(consumer.stats.inbox_unavailable >= 5),
                timeout=30,
                what="claims failing while the inbox is down",
            )
            await asyncio.sleep(3.5)  # longer than ack_wait (3 s) and the whole ladder
            info = await nc.jetstream().consumer_info("VIBESPRO_EVENTS", DURABLE)
            assert info.num_redelivered == 0  # held, not nak'ed nor expired
            await proxy.enable()
            await eventually(lambda: _processed(world, event.message_id), timeout=30, what="ok")
    finally:
        await proxy.disable()
    assert [c["body"]["delivery"]["attempt"] for c in handler.calls] == [1]
    conn = await asyncpg.connect(world.dsn("sea"))
    try:
        assert await conn.fetchval("SELECT count(*) FROM dead_letters") == 0
    finally:
        await conn.close()


async def _processed(env: Env, message_id: str) -> bool:
    row = await inbox_row(env, message_id)
    return row is not None and row["status"] == "processed" and bool(uuid.UUID(message_id))


async def _true(value: bool) -> bool:
    return value
