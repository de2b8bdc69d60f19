"""INFRA-005 §3.1 end to end: a handler's ``"retryable": false`` ends the retries at once.

The real consumer calls a real aiohttp handler; a 503 whose JSON body says
``"retryable": false`` is dead-lettered as HANDLER_NOT_RETRYABLE on its first delivery
(not after ``max_deliver`` of them), while a plain 503 is retried and then applied.
"""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import RunningConsumer, dead_letters, envelope, fast_durable, publish
from tests.consumer.hostile import HostileHandler, hostile, status, until_all

pytestmark = pytest.mark.integration
__all__ = ["hostile"]  # the fixture


async def test_retryable_false_dead_letters_on_the_first_delivery(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    fast_durable(env, hostile.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    final, transient = envelope(), envelope()
    body = json.dumps({"error": "account closed", "retryable": False}).encode()
    hostile.scripts[final.message_id] = [status(503, body, {"Retry-After": "1"})]
    hostile.scripts[transient.message_id] = [status(503, b'{"retryable": true}')]
    async with RunningConsumer(env, nc, hostile.url):
        await publish(nc, final)
        await publish(nc, transient)
        await until_all(env, [final.message_id], "failed")
        await until_all(env, [transient.message_id])
    assert len(hostile.calls[final.message_id]) == 1, "no retry after retryable: false"
    assert hostile.applied[transient.message_id] == 1
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "HANDLER_NOT_RETRYABLE"
    assert "account closed" in record["lastError"]
