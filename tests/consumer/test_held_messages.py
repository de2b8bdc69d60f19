"""A message the consumer holds costs it no delivery; one it cannot settle is nak'ed.

Issue 22 found three ways a healthy event spent its deliveries, or the process exited:
- during a 401/403 hold only ``concurrency`` messages were heart-beaten: the rest of the
  claimed batch aged past ack_wait, was redelivered and, past max_deliver, dead-lettered
  — against the rule that refused calls are never dead-lettered;
- a failed ``mark_retrying`` nak'ed with the inbox lease still held, so the redelivery
  found its own row leased and spent a delivery as a contended copy;
- ``js.publish`` of a dead-letter record raising ``APIError`` (a stream without leader,
  or full) escaped the consumer and ended the process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.js.api import DiscardPolicy

from chaos.proxy import Proxy
from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    dead_letters,
    envelope,
    fast_durable,
    publish,
)
from tests.consumer.hostile import HostileHandler, dead_letter_rows, hostile, status, until_all
from tests.helpers import eventually, stream_messages

pytestmark = pytest.mark.integration
__all__ = ["hostile"]  # the fixture


async def _max_deliveries_advisories(env: Env, nc: NATS) -> list[dict[str, Any]]:
    advisories = await stream_messages(nc.jetstream(), env.topology.advisory_stream)
    return [
        a.body
        for a in advisories
        if a.body.get("type", "").endswith("max_deliver") and a.body.get("consumer") == DURABLE
    ]


async def test_a_long_refusal_holds_the_whole_batch_alive_and_dead_letters_nothing(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    # ack_wait 2 s times max_deliver 3: the refusal outlasts every delivery JetStream would
    # make of a message nobody heart-beats. One handler slot for six messages.
    fast_durable(env, hostile.url, ack_wait="2s", max_deliver=3, backoff=["200ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    events = [envelope() for _ in range(6)]
    hostile.overload = status(401, b"bad signature")
    hostile.overloaded_until = time.monotonic() + 2 * 3 + 2
    running = RunningConsumer(env, nc, hostile.url, concurrency=1)
    async with running as consumer:
        consumer.decider.auth_retry = (0.2, 0.5)
        for event in events:
            await publish(nc, event)
        await until_all(env, [e.message_id for e in events], timeout=60)
        assert not running.task.done()
        info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    assert all(hostile.applied[e.message_id] == 1 for e in events)
    assert all(set(hostile.attempts[e.message_id]) == {1} for e in events)
    assert info.num_redelivered == 0
    assert await _max_deliveries_advisories(env, nc) == []
    assert await dead_letters(nc) == [] and await dead_letter_rows(env) == []


async def test_a_retry_record_lost_to_a_database_outage_costs_no_delivery(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    # The lease (handler timeout 5 s + 2) outlives the outage (3 s): a nak with the
    # lease still held makes the redelivery a contended copy, a delivery spent.
    fast_durable(env, hostile.url, handler={"url": hostile.url, "timeout": "5s"}, backoff=["200ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    parts = urlsplit(env.dsn("sea"))
    proxy = Proxy("inbox", "127.0.0.1:0", f"{parts.hostname}:{parts.port}", random.Random(1))
    await proxy.enable()
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@{proxy.listen}"))

    async def down_then_503(request: web.Request) -> web.StreamResponse:
        await proxy.disable()  # the inbox goes away while the handler answers
        asyncio.get_running_loop().call_later(3.0, lambda: asyncio.ensure_future(proxy.enable()))
        return web.Response(status=503)

    event = envelope()
    hostile.scripts[event.message_id] = [down_then_503]
    try:
        running = RunningConsumer(env, nc, hostile.url, dsn=via_proxy)
        async with running as consumer:
            await publish(nc, event)
            await until_all(env, [event.message_id], timeout=60)
            assert not running.task.done()
    finally:
        await proxy.disable()
    assert hostile.attempts[event.message_id] == [1, 2]
    assert hostile.applied[event.message_id] == 1
    assert consumer.stats.contended == 0 and consumer.stats.inbox_unavailable > 0


async def test_a_dead_letter_that_cannot_be_published_is_naked_and_written_later(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    fast_durable(env, hostile.url, backoff=["2s"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    js = nc.jetstream()
    dlq = (await js.stream_info("SEA_DLQ")).config
    # A full stream that refuses new messages answers the publish with an APIError
    # (503, as a stream without a leader does while NATS restarts).
    await js.update_stream(dataclasses.replace(dlq, max_bytes=1, discard=DiscardPolicy.NEW))
    event = envelope()
    hostile.scripts[event.message_id] = [status(422, b"no"), status(422, b"still no")]
    running = RunningConsumer(env, nc, hostile.url)
    async with running as consumer:
        await publish(nc, event)

        async def refused() -> bool:
            errors = consumer.metrics.role.registry.get_sample_value(
                "ferry_consumer_errors_total", {"durable": DURABLE, "stage": "dead_letter"}
            )
            return errors == 1

        await eventually(refused, timeout=30, what="the dead-letter publish refused")
        assert not running.task.done()
        await js.update_stream(dlq)
        await until_all(env, [event.message_id], "failed", timeout=30)
        assert not running.task.done()
    assert hostile.attempts[event.message_id] == [1, 2]
    [record] = await dead_letters(nc)
    assert record["message_id"] == event.message_id
    assert record["reasonCode"] == "HANDLER_REJECTED" and record["attempts"] == 2
    assert [r["message_id"] for r in await dead_letter_rows(env)] == [uuid.UUID(event.message_id)]
