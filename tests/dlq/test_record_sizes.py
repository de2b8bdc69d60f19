"""Dead-letter records are UTF-8 and never too large to publish (issue 22, finding 2 there).

A valid multi-byte event — 300,000 Cyrillic characters, 600 KB of UTF-8 — used to make
every dead-letter record of it (6 bytes per character once ASCII-escaped) overflow the
1 MiB max_payload: the consumer crash-looped and the message was never dead-lettered.
The scripted handler is the independent record of what was processed; the dead-letter
stream is read back byte for byte.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from shared.adapters.dead_letters.records import encode
from tests.conftest import CAPS, Env
from tests.consumer.conftest import RunningConsumer, ScriptedHandler, envelope, fast_durable
from tests.dlq.support import Roles, publish_utf8, raw_records, status_of, true
from tests.helpers import eventually

pytestmark = [
    pytest.mark.integration,
    # aiohttp advises streaming bodies this large; the test run turns warnings into errors.
    pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning"),
]

NAME = "Ж" * 300_000  # 600,000 bytes of UTF-8
#: 300,000 bytes of UTF-8: over the small dead-letter stream's limit below, and under the
#: handler's 1 MiB request limit even if a body were ASCII-escaped (900 KB).
MID_NAME = "Ж" * 150_000
SMALL_DLQ = 256 * 1024


async def small_dead_letter_stream(nc: NATS) -> None:
    """SEA_DLQ accepts records of at most 256 KiB (set on the server, as an operator would):
    the 600 KB payload must go by reference."""
    js = nc.jetstream()
    config = (await js.stream_info("SEA_DLQ")).config
    config.max_msg_size = SMALL_DLQ
    await js.update_stream(config)


async def test_a_multibyte_event_answered_413_is_dead_lettered_as_utf8(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope(name=NAME)
    handler.scripts[event.message_id] = [413]
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await publish_utf8(nc, event)
        await eventually(
            lambda: true(consumer.stats.dead_lettered == 1), timeout=60, what="dead-lettered"
        )
    [data] = await raw_records(nc.jetstream())
    assert len(data) <= 1024 * 1024
    assert NAME.encode() in data  # UTF-8 on the wire, not \\u0416 escapes
    record = json.loads(data)
    assert record["payload"]["payload"]["name"] == NAME
    assert record["reasonCode"] == "HANDLER_BAD_REQUEST"
    assert handler.applied[event.message_id] == 0


async def test_a_record_over_the_dead_letter_streams_limit_keeps_the_payload_by_reference(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, replay_limits={"base_delay": "200ms", "max_delay": "300ms"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await small_dead_letter_stream(nc)
    event = envelope(name=MID_NAME)
    handler.scripts[event.message_id] = [413]  # then 200: the replay is processed
    async with RunningConsumer(env, nc, handler.url), Roles(env, nc.jetstream()) as roles:
        await publish_utf8(nc, event)
        await eventually(
            lambda: _status_is(env, event.message_id, "dead"), timeout=60, what="dead letter"
        )
        [data] = await raw_records(nc.jetstream())
        roles.replayer()
        await eventually(
            lambda: _status_is(env, event.message_id, "replayed"), timeout=60, what="replayed"
        )
        assert roles.alive()
    assert len(data) <= SMALL_DLQ
    reference = json.loads(data)["payload"]
    assert reference["by_reference"] is True
    assert reference["original"] == {"stream": "VIBESPRO_EVENTS", "stream_sequence": 1}
    assert reference["stored"]["message_id"] == event.message_id
    kept = encode(event.to_dict())
    assert reference["bytes"] == len(kept) > SMALL_DLQ
    assert reference["sha256"] == hashlib.sha256(kept).hexdigest()
    # The replay carried the whole payload: the handler saw the name, applied it once.
    assert handler.applied[event.message_id] == 1
    assert handler.calls[-1]["body"]["payload"]["name"] == MID_NAME


async def test_the_router_keeps_a_too_large_payload_by_reference_from_the_advisory(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, max_deliver=2, backoff=["100ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await small_dead_letter_stream(nc)
    event = envelope(name=MID_NAME)
    handler.scripts[event.message_id] = [500, 500]
    async with RunningConsumer(env, nc, handler.url), Roles(env, nc.jetstream()) as roles:
        router = roles.router()
        await publish_utf8(nc, event)
        await eventually(lambda: true(router.stats.recorded == 1), timeout=60, what="recorded")
        assert roles.alive()
    [data] = await raw_records(nc.jetstream())
    record = json.loads(data)
    assert len(data) <= SMALL_DLQ
    assert record["reasonCode"] == "MAX_DELIVERIES_EXCEEDED"
    assert record["payload"]["by_reference"] is True
    assert record["payload"]["sha256"] == hashlib.sha256(encode(event.to_dict())).hexdigest()


async def _status_is(env: Env, message_id: str, status: str) -> bool:
    return await status_of(env, message_id) == status
