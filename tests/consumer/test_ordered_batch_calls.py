"""Batch handler calls on an ``ordering: key`` durable (issue 29): a key's events still go
one at a time, in stream order, each waiting for its own decision; only different keys'
events share a call. The real consumer, a real aiohttp handler answering batch calls
(wire format 1), real NATS and PostgreSQL.

The handler is the independent record: the order in which it applied each key's events,
every POST it received (which events, at once with which others) and the keys it had in
progress at any moment.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    dead_letters,
    envelope,
    fast_durable,
    publish,
    serving,
)
from tests.consumer.hostile import until_all
from tests.consumer.test_batch_calls import BatchHandler
from tests.helpers import eventually

pytestmark = pytest.mark.integration


class OrderedBatchHandler(BatchHandler):
    """A batch handler that also records, per key, the order it applied events in, the
    keys each POST carried, and whether a key was ever in two POSTs at once."""

    def __init__(self) -> None:
        super().__init__()
        self.order: dict[str, list[str]] = defaultdict(list)
        self.in_flight: dict[str, int] = defaultdict(int)
        self.overlaps: list[str] = []
        self.repeated: list[list[str]] = []
        #: Seconds to wait before answering a POST, chosen from its events.
        self.pause: Callable[[list[dict[str, Any]]], float] = lambda _: 0.0

    async def handle(self, request: web.Request) -> web.Response:
        doc = await request.json()
        keys = [str(event["aggregate_id"]) for event in doc["events"]]
        if len(set(keys)) < len(keys):
            self.repeated.append(keys)
        for key in keys:
            self.in_flight[key] += 1
            if self.in_flight[key] > 1:
                self.overlaps.append(key)
        try:
            await asyncio.sleep(self.pause(doc["events"]))
            before = dict(self.applied)
            response = await super().handle(_Replayed(request, doc))
            for event in doc["events"]:
                mid = event["message_id"]
                if self.applied[mid] and not before.get(mid):
                    self.order[str(event["aggregate_id"])].append(mid)
            return response
        finally:
            for key in keys:
                self.in_flight[key] -= 1

    def posts_with(self, message_id: str) -> list[list[str]]:
        """The ids of every POST that carried ``message_id``."""
        found = []
        for post in self.posts:
            ids = [e["message_id"] for e in post["doc"]["events"]]
            if message_id in ids:
                found.append(ids)
        return found


class _Replayed:
    """The request again for :meth:`BatchHandler.handle`, whose body was read already."""

    def __init__(self, request: web.Request, doc: Any) -> None:
        self.headers, self._doc = request.headers, doc

    async def read(self) -> bytes:
        return json.dumps(self._doc).encode()


@pytest.fixture
async def ordered_handler() -> AsyncIterator[OrderedBatchHandler]:
    scripted = OrderedBatchHandler()
    async with serving(scripted.handle, scripted.port):
        yield scripted


async def _world(env: Env, nc: NATS, url: str, batch: int, **overrides: Any) -> None:
    fast_durable(env, url, ordering="key", **overrides)
    env.doc["durables"][DURABLE]["handler"]["batch"] = batch
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)


async def _publish_keys(nc: NATS, keys: list[str], per_key: int) -> dict[str, list[str]]:
    """``per_key`` events per key, interleaved; each key's ids in publish order."""
    order: dict[str, list[str]] = defaultdict(list)
    for index in range(per_key):
        for key in keys:
            event = envelope(vibe_id=key, title=f"{key}-{index}")
            order[key].append(event.message_id)
            await publish(nc, event)
    return dict(order)


def _every(order: dict[str, list[str]]) -> list[str]:
    return [mid for ids in order.values() for mid in ids]


async def _parked(env: Env) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return list(
            await conn.fetch(
                "SELECT * FROM parked_messages WHERE durable = $1"
                " ORDER BY ordering_key, stream_seq",
                DURABLE,
            )
        )
    finally:
        await conn.close()


async def test_keys_share_calls_and_each_key_is_applied_in_order(
    env: Env, nc: NATS, ordered_handler: OrderedBatchHandler
) -> None:
    await _world(env, nc, ordered_handler.url, batch=10)
    rng = random.Random(11)
    ordered_handler.pause = lambda _: rng.choice([0.0, 0.005, 0.02])
    order = await _publish_keys(nc, [f"k{i}" for i in range(24)], per_key=6)
    async with RunningConsumer(env, nc, ordered_handler.url, concurrency=4) as consumer:
        await until_all(env, _every(order), timeout=60)
    assert ordered_handler.order == order, "a key's events were applied out of stream order"
    assert ordered_handler.overlaps == [], "a key was in two calls at once"
    assert ordered_handler.repeated == [], "a call carried two events of one key"
    sizes = [len(p["doc"]["events"]) for p in ordered_handler.posts]
    assert len(sizes) < len(_every(order)), f"{len(sizes)} POSTs for {len(_every(order))}"
    assert max(sizes) > 1 and max(sizes) <= 10
    assert all(count == 1 for count in ordered_handler.applied.values())
    assert consumer.stats.handler_calls == len(sizes)
    assert consumer.stats.parked == 0


async def test_a_failing_event_parks_only_its_own_key_in_a_shared_call(
    env: Env, nc: NATS, ordered_handler: OrderedBatchHandler
) -> None:
    await _world(env, nc, ordered_handler.url, batch=20, on_dead_letter="hold")
    keys = ["retried", "held"] + [f"k{i}" for i in range(6)]
    order = await _publish_keys(nc, keys, per_key=4)
    retried, held = order["retried"][0], order["held"][0]
    ordered_handler.scripts[retried] = [
        {"status": 503, "retryable": True},
        {"status": 503, "retry_after": 1, "retryable": True},
    ]
    ordered_handler.scripts[held] = [{"status": 422, "error": {"reason_code": "NO"}}]
    others = [mid for key in keys[2:] for mid in order[key]]
    async with RunningConsumer(env, nc, ordered_handler.url) as consumer:
        await until_all(env, others + order["retried"], timeout=60)
        rows = await _parked(env)
        assert [r["message_id"] for r in rows] == [uuid.UUID(m) for m in order["held"]]
        assert [r["state"] for r in rows] == ["held", "queued", "queued", "queued"]
        await asyncio.sleep(0.5)  # nothing of the held key moves meanwhile
        assert set(ordered_handler.calls) & set(order["held"]) == {held}
        assert consumer.stats.parked >= 8  # both heads and the three behind each
    # The failing heads were called beside other keys' events, which went on.
    [first_call] = ordered_handler.posts_with(retried)[:1]
    assert len(first_call) > 1
    assert any(mid in others for mid in ordered_handler.posts_with(held)[0])
    # The retried head: three calls (503, 503 with Retry-After, 200), then its key in order.
    calls = ordered_handler.calls[retried]
    assert len(calls) == 3 and calls[2] - calls[1] >= 0.9
    assert ordered_handler.order["retried"] == order["retried"]
    for key in keys[2:]:
        assert ordered_handler.order[key] == order[key]
    assert "held" not in ordered_handler.order
    [record] = [r for r in await dead_letters(nc) if r["message_id"] == held]
    assert record["ordering"] == {"key": "vibe/held", "policy": "hold", "held": True}
    assert ordered_handler.overlaps == [] and ordered_handler.repeated == []


async def test_a_whole_call_failing_retries_each_of_its_events_in_key_order(
    env: Env, nc: NATS, ordered_handler: OrderedBatchHandler
) -> None:
    await _world(
        env, nc, ordered_handler.url, batch=10, backoff=["300ms", "300ms", "300ms"], max_deliver=6
    )
    order = await _publish_keys(nc, [f"k{i}" for i in range(8)], per_key=5)
    seen: list[int] = []

    def whole(events: list[dict[str, Any]]) -> tuple[int, bytes, dict[str, str]] | None:
        seen.append(len(events))
        if len(seen) <= 2:  # the first two calls: the handler is overloaded
            return 503, b'{"error": "busy"}', {}
        return None

    stalled: list[list[str]] = []

    def pause(events: list[dict[str, Any]]) -> float:
        if len(seen) == 2 and not stalled:  # the third call times out (applied late)
            stalled.append([e["message_id"] for e in events])
            return 1.5
        return 0.0

    ordered_handler.whole = whole
    ordered_handler.pause = pause
    async with RunningConsumer(env, nc, ordered_handler.url) as consumer:
        await until_all(env, _every(order), timeout=60)

        async def answered() -> bool:
            return not any(ordered_handler.in_flight.values())

        await eventually(answered, timeout=5, what="the stalled call answered")
    failed = ordered_handler.posts[:2]
    assert sum(len(p["doc"]["events"]) for p in failed) > 2
    for post in failed:  # every event of a 503 call was called again
        for event in post["doc"]["events"]:
            assert len(ordered_handler.calls[event["message_id"]]) >= 2
    assert stalled and all(len(ordered_handler.calls[mid]) >= 2 for mid in stalled[0])
    assert ordered_handler.order == order
    assert all(count == 1 for count in ordered_handler.applied.values())
    assert consumer.stats.parked > 0
    assert await _parked(env) == []
