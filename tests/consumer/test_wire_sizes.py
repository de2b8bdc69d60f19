"""Sizes are wire sizes: the consumer sends the handler UTF-8 JSON, not ASCII escapes.

Issue 22: an event whose text is 300,000 Cyrillic letters (600 KB as UTF-8, under the
producer's limit) went to the handler as ``\\u041f``-escaped JSON, 1.8 MB: an aiohttp
handler with its default 1 MiB body limit answered 413, and the event was dead-lettered
although nothing was wrong with it.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import RunningConsumer, dead_letters, envelope, fast_durable, publish
from tests.consumer.hostile import HostileHandler, hostile, until_all

pytestmark = pytest.mark.integration
__all__ = ["hostile"]  # the fixture

#: What aiohttp's server accepts by default (web.Application's client_max_size).
AIOHTTP_DEFAULT_LIMIT = 1024**2


async def test_a_multibyte_event_reaches_the_handler_as_utf8_within_its_body_limit(
    env: Env, nc: NATS, hostile: HostileHandler
) -> None:
    fast_durable(env, hostile.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    title = "П" * 300_000
    event = envelope(title=title)
    wire = event.to_wire()
    assert len(wire) < AIOHTTP_DEFAULT_LIMIT < len(title) * 6  # escaped, it would not fit
    async with RunningConsumer(env, nc, hostile.url):
        await publish(nc, event)
        await until_all(env, [event.message_id], timeout=60)
    assert hostile.applied[event.message_id] == 1
    [size] = hostile.sizes[event.message_id]
    # The payload's letters travel as 2 UTF-8 bytes each; the rest is the envelope.
    assert len(title.encode()) < size < len(title.encode()) + 4096
    assert await dead_letters(nc) == []
