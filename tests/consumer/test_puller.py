"""The continuous pull (services.inbox_consumer.puller) against a real nats-server.

What a consumer relies on: a batch is whatever has arrived (it never waits to fill up),
requests that expire are renewed, a deleted durable is reported rather than waited on
forever, two replicas of one durable share its messages, and messages that arrived but
were never handed out are returned on stop rather than silently held.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from services.inbox_consumer import loop as loop_module
from services.inbox_consumer import puller as puller_module
from services.inbox_consumer.puller import ConsumerGone, DeliveryGap, Puller
from shared.access.streams import provision
from shared.adapters.jetstream import status_of
from tests.conftest import CAPS, Env, admin_auth
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    publish,
)
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def _provisioned(env: Env, nc: NATS, **durable: object) -> None:
    env.doc["durables"][DURABLE].update(durable)
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)


async def _publish(nc: NATS, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        event = envelope()
        await publish(nc, event)
        ids.append(event.message_id)
    return ids


async def test_a_batch_is_what_arrived_not_a_full_one(env: Env, nc: NATS) -> None:
    await _provisioned(env, nc)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=50)
    await puller.start()
    try:
        assert await puller.next_batch(50, timeout=0.3) == []  # nothing yet
        sent = await _publish(nc, 3)
        # Asked for 50 with a minute to wait: the 3 there are handed over without waiting
        # for the rest (the guard is ten times shorter than the wait it must not do).
        batch = await asyncio.wait_for(puller.next_batch(50, timeout=60), timeout=6)
        while len(batch) < 3:
            batch += await asyncio.wait_for(puller.next_batch(50, timeout=60), timeout=6)
        assert sorted(m.headers["Nats-Msg-Id"] for m in batch) == sorted(sent)  # type: ignore[index]
        for msg in batch:
            await msg.ack()
    finally:
        await puller.stop()


async def test_limit_splits_what_arrived(env: Env, nc: NATS) -> None:
    await _provisioned(env, nc)
    await _publish(nc, 7)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10)
    await puller.start()
    try:
        seen: list[int] = []
        while sum(seen) < 7:
            batch = await puller.next_batch(3, timeout=5)
            assert 1 <= len(batch) <= 3
            seen.append(len(batch))
            for msg in batch:
                await msg.ack()
        assert sum(seen) == 7
    finally:
        await puller.stop()


async def test_expired_requests_are_renewed(
    env: Env, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(puller_module, "IDLE_HEARTBEAT", 0.4)
    await _provisioned(env, nc)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=5, expires=1.0)
    await puller.start()
    try:
        # Several request lifetimes pass with nothing to deliver; each 408 gives its
        # credit back, so the puller keeps asking and nothing accumulates.
        for _ in range(8):
            assert await puller.next_batch(5, timeout=0.4) == []
            assert 0 <= puller.outstanding <= 5
        [sent] = await _publish(nc, 1)
        batch: list = []
        while not batch:
            batch = await puller.next_batch(5, timeout=2)
        assert [m.headers["Nats-Msg-Id"] for m in batch] == [sent]  # type: ignore[index]
        await batch[0].ack()
    finally:
        await puller.stop()


async def test_short_lived_requests_are_renewed_as_they_expire(env: Env, nc: NATS) -> None:
    """An ordered partition's requests live a fraction of a second (the partition lease
    must outlast them); each one that expires is replaced at once, so a message published
    while the consumer waits is handed over in that same wait, not after it."""
    await _provisioned(env, nc)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=5, expires=0.2)
    await puller.start()
    try:
        assert await puller.next_batch(5, timeout=0.3) == []  # a request is waiting

        async def publish_later() -> list[str]:
            await asyncio.sleep(1.5)  # several lifetimes of the request
            return await _publish(nc, 1)

        later = asyncio.create_task(publish_later())
        batch = await puller.next_batch(5, timeout=30)
        assert [m.headers["Nats-Msg-Id"] for m in batch] == await later  # type: ignore[index]
        await batch[0].ack()
        assert 0 <= puller.outstanding <= 5
    finally:
        await puller.stop()


async def test_a_deleted_durable_is_reported(env: Env, nc: NATS) -> None:
    await _provisioned(env, nc)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=5)
    await puller.start()
    try:
        assert await puller.next_batch(5, timeout=0.3) == []  # a request is waiting
        await nc.jetstream().delete_consumer(STREAM, DURABLE)
        with pytest.raises(ConsumerGone):
            for _ in range(20):
                await puller.next_batch(5, timeout=0.5)
    finally:
        await puller.stop()


async def test_stop_returns_what_was_never_handed_out(env: Env, nc: NATS) -> None:
    await _provisioned(env, nc)
    sent = await _publish(nc, 6)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10)
    await puller.start()
    first = await puller.next_batch(2, timeout=5)
    await eventually(
        lambda: _arrived(puller, 6 - len(first)), timeout=10, what="the rest delivered"
    )
    left = await puller.stop()
    got = [m.headers["Nats-Msg-Id"] for m in first + left]  # type: ignore[index]
    assert sorted(got) == sorted(sent)


async def test_a_message_delivered_as_the_pull_stops_is_returned_not_dropped(
    env: Env, nc: NATS
) -> None:
    """The server delivers into the open request while the owner's loop is busy, then the
    owner stops: the message is read, returned and can be nak'd at once. Dropped with the
    subscription, it waited out ack_wait while a successor took the partition (released
    as clean) and handled a later event of its key first (issue 48's ordering finding)."""
    await _provisioned(env, nc)
    for _ in range(5):  # the window is a moment: several stops, each must keep its message
        puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10, expires=1.0)
        await puller.start()
        assert await puller.next_batch(10, timeout=0.3) == []  # a request is outstanding
        [sent] = await _publish(nc, 1)
        time.sleep(0.05)  # noqa: ASYNC251 (busy on purpose: the delivery waits unread)
        left = await puller.stop()
        assert puller.drained
        assert [m.headers["Nats-Msg-Id"] for m in left] == [sent]  # type: ignore[index]
        for msg in left:
            await msg.ack()
    info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    assert info.num_ack_pending == 0, "nothing left in flight"


async def test_the_naks_at_stop_reach_the_server_before_the_partition_is_called_settled(
    env: Env, nc: NATS, nats_server: NatsServer
) -> None:
    """What :meth:`Puller.stop` returned is nak'd, then :meth:`Puller.flushed` makes a
    round trip: once it says so, the server has every message back, and a successor on
    another connection gets them first, at once (not after ack_wait, 120 s here). On a
    closed connection it says no."""
    await _provisioned(env, nc)
    sent = await _publish(nc, 4)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10)
    await puller.start()
    first = await puller.next_batch(1, timeout=5)
    await eventually(lambda: _arrived(puller, 3), timeout=10, what="the rest delivered")
    left = await puller.stop()
    ids = [m.headers["Nats-Msg-Id"] for m in left]  # type: ignore[index]
    assert sorted([m.headers["Nats-Msg-Id"] for m in first] + ids) == sorted(sent)  # type: ignore[index]
    for msg in first:
        await msg.ack()
    for msg in left:
        await msg.nak()
    assert puller.drained and await puller.flushed()

    options = admin_auth(nats_server).options([nats_server.url])
    other = await nats.connect(nats_server.url, **options)
    successor = Puller(other.jetstream(), stream=STREAM, durable=DURABLE, window=10)
    await successor.start()
    try:
        again: list[Any] = []
        deadline = time.monotonic() + 5
        while len(again) < len(ids) and time.monotonic() < deadline:
            again += await successor.next_batch(10, timeout=1)
        assert sorted(m.headers["Nats-Msg-Id"] for m in again) == sorted(ids)  # type: ignore[index]
        for msg in again:
            await msg.ack()
    finally:
        await successor.stop()
        await other.close()
    assert not await successor.flushed(), "a closed connection cannot confirm anything"


async def test_a_delivery_lost_in_transit_stops_the_pull_until_it_is_redelivered(
    env: Env, nc: NATS
) -> None:
    """An ordered partition's third delivery never arrives (sent as the connection
    dropped). The server holds it until ack_wait and meanwhile delivers what follows;
    handed out, a key's later events would reach the handler before it. The puller hands
    out what came before the jump in the consumer sequence, then raises DeliveryGap, and
    answers nothing after it: once ack_wait has run out, a new pull gets the lost one
    first and the rest in order, nothing missing."""
    await _provisioned(env, nc, ack_wait="2s")
    sent = await _publish(nc, 6)
    puller = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10, watch_gaps=True)
    arrive, deliveries = puller._on_msg, 0

    async def in_transit(msg: Any) -> None:
        nonlocal deliveries
        if not status_of(msg):
            deliveries += 1
            if deliveries == 3:
                return  # lost on the way
        await arrive(msg)

    async def all_delivered() -> bool:
        return deliveries >= 6

    puller._on_msg = in_transit  # type: ignore[method-assign]
    await puller.start()
    got, gap = await _until_gap(puller)
    for msg in got:
        await msg.ack()
    assert [m.headers["Nats-Msg-Id"] for m in got] == sent[:2]  # type: ignore[index]
    assert gap.startswith(f"deliveries 3 of {DURABLE} never arrived"), gap
    await eventually(all_delivered, timeout=10, what="what follows delivered")
    with pytest.raises(DeliveryGap):  # ... and never handed out
        await puller.next_batch(10, timeout=0.5)
    assert await puller.stop() == [], "nothing to nak: a nak would put it before the lost one"

    again = Puller(nc.jetstream(), stream=STREAM, durable=DURABLE, window=10, watch_gaps=True)
    await again.start()
    try:
        order = await _first_deliveries(again, 4)
        assert order == sent[2:], "the lost one first, then the rest in stream order"
    finally:
        await again.stop()
    info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    assert info.num_pending == 0


async def _until_gap(puller: Puller) -> tuple[list[Any], str]:
    """What the puller hands out until it raises DeliveryGap (within 10 s), and its word."""
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            got += await puller.next_batch(10, timeout=0.5)
        except DeliveryGap as exc:
            return got, str(exc)
    return got, ""


async def _first_deliveries(puller: Puller, count: int) -> list[str]:
    """The ids of the first ``count`` distinct messages, in arrival order, each acked as
    it comes (a slow loop's redelivery of one is not counted twice)."""
    order: list[str] = []
    deadline = time.monotonic() + 20
    while len(order) < count and time.monotonic() < deadline:
        for msg in await puller.next_batch(10, timeout=1):
            await msg.ack()
            if msg.headers["Nats-Msg-Id"] not in order:
                order.append(msg.headers["Nats-Msg-Id"])
    return order


async def _arrived(puller: Puller, count: int) -> bool:
    return puller._queue.qsize() >= count


async def test_two_replicas_share_one_durable(env: Env, nc: NATS, handler: ScriptedHandler) -> None:
    # Two batches of room in max_ack_pending (the ack-pending lint rule), two replicas.
    fast_durable(env, handler.url, batch_size=10, max_ack_pending=20)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    handler.delay = 0.01
    sent = await _publish(nc, 150)
    async with (
        RunningConsumer(env, nc, handler.url) as one,
        RunningConsumer(env, nc, handler.url) as two,
    ):
        await eventually(
            lambda: _done(one.stats.processed + two.stats.processed, len(sent)),
            timeout=60,
            what="all 150 processed",
        )
        shares = (one.stats.processed, two.stats.processed)
    assert sum(shares) == len(sent)
    assert min(shares) > 0, f"one replica did all the work: {shares}"
    assert sorted(handler.applied) == sorted(sent)
    assert set(handler.applied.values()) == {1}
    assert len({uuid.UUID(m) for m in handler.applied}) == len(sent)


async def _done(count: int, target: int) -> bool:
    return count >= target


async def test_consumer_reports_a_deleted_durable_and_resumes_when_it_is_back(
    world: Env, nc: NATS, handler: ScriptedHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_module, "GONE_PAUSE", 0.2)
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await eventually(lambda: _is(consumer.stats.bound, True), timeout=10, what="bound")
        await nc.jetstream().delete_consumer(STREAM, DURABLE)
        await eventually(lambda: _is(consumer.stats.bound, False), timeout=20, what="unbound")
        await asyncio.sleep(0.5)
        assert consumer.stats.bound is False  # stays unready while the durable is gone
        await provision(nc.jetstream(), world.topology, caps=CAPS)
        await eventually(lambda: _is(consumer.stats.bound, True), timeout=20, what="bound again")
        [sent] = await _publish(nc, 1)
        await eventually(
            lambda: _is(handler.applied.get(sent), 1), timeout=20, what="processed after"
        )


async def _is(value: object, expected: object) -> bool:
    return value == expected
