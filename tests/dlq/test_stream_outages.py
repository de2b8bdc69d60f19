"""The dlq-router and dlq-replayer ride out a stream without a leader (issue 22).

``js.publish`` into a stream that cannot answer (no leader during a NATS restart, a stream
being recreated) raises NoStreamResponseError / APIError / TimeoutError. The roles used
to exit on it. Here the stream stops capturing the subject for a while; the roles must
stay up, keep every advisory and every replay, and finish the work once it is back:
every dead letter recorded exactly once, every replay processed once, no attempt spent
twice. Counts come from the dead-letter stream, the databases and the scripted handler.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from tests.conftest import Env
from tests.consumer.conftest import RunningConsumer, ScriptedHandler, envelope, publish
from tests.dlq.support import (
    Roles,
    dead_letter_rows,
    raw_records,
    statuses_are,
    subjects_removed,
    true,
)
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def test_router_records_each_dead_letter_once_across_a_dead_letter_stream_outage(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    events = [envelope() for _ in range(4)]
    for event in events:
        handler.scripts[event.message_id] = [500] * 4
    js = nc.jetstream()
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await asyncio.gather(*(publish(nc, e) for e in events))
        await eventually(
            lambda: true(consumer.stats.exhausted == len(events)), timeout=60, what="exhausted"
        )
    async with Roles(world, js) as roles:
        async with subjects_removed(js, "SEA_DLQ", "sea.dlq"):
            router = roles.router()
            await eventually(
                lambda: true(router.stats.errors >= len(events)), timeout=60, what="failed tries"
            )
            assert roles.alive() and router.stats.recorded == 0
        await eventually(
            lambda: true(router.stats.recorded == len(events)), timeout=60, what="all recorded"
        )
        assert roles.alive()
    records = [json.loads(r) for r in await raw_records(js)]
    assert Counter(r["message_id"] for r in records) == Counter(e.message_id for e in events)
    stored = await dead_letter_rows(world)
    assert sorted(str(r["message_id"]) for r in stored) == sorted(e.message_id for e in events)
    assert {r["generation"] for r in stored} == {1}


async def test_replayer_finishes_every_replay_across_a_stream_outage(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    events = [envelope() for _ in range(3)]
    for event in events:
        handler.scripts[event.message_id] = [422]  # rejected once, accepted on the replay
    ids = [e.message_id for e in events]
    js = nc.jetstream()
    async with RunningConsumer(world, nc, handler.url), Roles(world, js) as roles:
        await asyncio.gather(*(publish(nc, e) for e in events))
        await eventually(lambda: statuses_are(world, ids, "dead"), timeout=60, what="dead")
        async with subjects_removed(js, "VIBESPRO_EVENTS", "ferry.replay."):
            replayer = roles.replayer(unconfirmed_after=0.5)
            await eventually(
                lambda: true(replayer.stats.errors >= 3), timeout=60, what="failed publishes"
            )
            assert roles.alive() and replayer.stats.replayed == 0
        await eventually(lambda: statuses_are(world, ids, "replayed"), timeout=60, what="replayed")
        assert roles.alive()
    assert all(handler.applied[m] == 1 for m in ids)
    assert len(handler.calls) == 2 * len(events)  # the rejection and one replay each
    stored = await dead_letter_rows(world)
    assert sorted(r["replay_attempts"] for r in stored) == [1, 1, 1]  # no attempt spent twice


async def test_router_and_replayer_ride_out_a_nats_restart(
    world: Env, nc: NATS, handler: ScriptedHandler, nats_server: NatsServer
) -> None:
    exhausted = [envelope() for _ in range(4)]  # the router records these
    rejected = [envelope() for _ in range(3)]  # the consumer records these; replayed
    for event in exhausted:
        handler.scripts[event.message_id] = [500] * 4
    for event in rejected:
        handler.scripts[event.message_id] = [422]
    ids = [e.message_id for e in exhausted + rejected]
    js = nc.jetstream()
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await asyncio.gather(*(publish(nc, e) for e in exhausted + rejected))
        await eventually(
            lambda: true(consumer.stats.exhausted == 4 and consumer.stats.dead_lettered == 3),
            timeout=60,
            what="failures",
        )
    async with Roles(world, js) as roles:
        router = roles.router()
        replayer = roles.replayer(unconfirmed_after=0.5)
        await asyncio.to_thread(nats_server.stop)
        await asyncio.sleep(3.0)  # the roles keep trying against a server that is gone
        await asyncio.to_thread(nats_server.start)  # same port, same store
        await eventually(lambda: true(router.stats.recorded == 4), timeout=90, what="recorded")
        assert roles.alive()
        async with RunningConsumer(world, nc, handler.url):
            await eventually(lambda: statuses_are(world, ids, "replayed"), timeout=90, what="all")
        # Each replayed once: published at once, or (its publish caught by the restart)
        # published again by the replayer's own unconfirmed-replay pass.
        stats = replayer.stats
        assert roles.alive() and stats.replayed + stats.republished == len(ids)
    assert all(handler.applied[m] == 1 for m in ids)
    stored = await dead_letter_rows(world)
    assert sorted(str(r["message_id"]) for r in stored) == sorted(ids)
    assert {(r["generation"], r["replay_attempts"]) for r in stored} == {(1, 1)}
    records = [json.loads(r) for r in await raw_records(js)]
    assert Counter(r["message_id"] for r in records) == Counter(ids)
