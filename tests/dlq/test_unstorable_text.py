"""Text PostgreSQL cannot store (NUL, U+0000) never keeps a message from its dead letter.

``jsonb`` refuses ``\\u0000``. A body with a NUL byte (malformed, dead-lettered with its raw
text) or an envelope whose payload holds U+0000 (valid JSON; a handler rejects it) used to
fail the dead-letter write on every attempt: the message was never dead-lettered. The
store keeps such a payload exactly (base64 of its bytes), and a replay sends it unchanged.
"""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client as NATS

from tests.conftest import Env
from tests.consumer.conftest import (
    RunningConsumer,
    ScriptedHandler,
    envelope,
    publish,
    publish_raw,
)
from tests.dlq.support import Roles, raw_records, status_of, true
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def _status_is(env: Env, message_id: str, status: str) -> bool:
    return await status_of(env, message_id) == status


async def test_a_body_with_a_nul_byte_is_dead_lettered(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    body = b'{"message_id": "x\x00y", garbage'
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await publish_raw(nc, "vibespro.event.vibe_created.v1", body, msg_id="nul-1")
        await eventually(
            lambda: true(consumer.stats.dead_lettered == 1), timeout=30, what="dead-lettered"
        )
    [data] = await raw_records(nc.jetstream())
    assert json.loads(data)["payload"] == body.decode()  # the stream record keeps it whole
    assert handler.calls == []


async def test_an_envelope_holding_nul_is_dead_lettered_and_replayed_unchanged(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope(name="before\x00after")
    handler.scripts[event.message_id] = [422]  # then 200
    async with RunningConsumer(world, nc, handler.url), Roles(world, nc.jetstream()) as roles:
        await publish(nc, event)
        await eventually(
            lambda: _status_is(world, event.message_id, "dead"), timeout=30, what="dead"
        )
        roles.replayer()
        await eventually(
            lambda: _status_is(world, event.message_id, "replayed"), timeout=30, what="replayed"
        )
        assert roles.alive()
    assert handler.applied[event.message_id] == 1
    assert handler.calls[-1]["body"]["payload"]["name"] == "before\x00after"
