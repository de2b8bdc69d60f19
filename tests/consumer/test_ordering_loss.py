"""``ordering: key`` when something goes missing on the way (issue 48).

The server counts a message delivered once written to the connection; one that never
arrives stays pending until its ``ack_wait`` while the server hands out what follows. A
partition's consumer loop must not let a key's later events reach the handler first. And
a parked head left waiting at 'infinity' for nothing must not wait for a takeover.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from services.inbox_consumer import ordering_drain
from services.inbox_consumer.puller import Puller
from shared.adapters import parking
from shared.adapters.jetstream import status_of
from tests.conftest import Env
from tests.consumer.conftest import DURABLE, RunningConsumer, ScriptedHandler, envelope
from tests.consumer.test_ordering import applied_order, ordered_world, publish_keys, until

pytestmark = pytest.mark.integration


async def test_a_delivery_lost_in_transit_ends_the_run_unsettled_and_nothing_overtakes_it(
    env: Env, nc: NATS, handler: ScriptedHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third of a key's six deliveries never arrives (the connection dropped as the
    server sent it). The partition's run hands the first two to the handler, sees the jump
    in the consumer sequence, and ends by itself, unsettled: the handler never gets the
    key's later events ahead of the lost one. The next run (after ack_wait, as the
    partition's slot restarts it) gets all four, the lost one first."""
    await ordered_world(env, nc, handler)
    order = await publish_keys(nc, ["a"], per_key=6)
    arrive, deliveries = Puller._on_msg, 0

    async def in_transit(self: Puller, msg: Any) -> None:
        nonlocal deliveries
        if not status_of(msg):
            deliveries += 1
            if deliveries == 3:
                return  # lost on the way
        await arrive(self, msg)

    monkeypatch.setattr(Puller, "_on_msg", in_transit)
    lossy = RunningConsumer(env, nc, handler.url)
    consumer = await lossy.__aenter__()
    try:
        await asyncio.wait_for(asyncio.shield(lossy.task), timeout=30)  # ends by itself
    finally:
        await lossy.__aexit__()
    assert not consumer.settled and "never arrived" in consumer.unsettled
    assert consumer.stats.delivery_gaps == 1
    assert applied_order(handler) == {"a": order["a"][:2]}

    monkeypatch.undo()
    async with RunningConsumer(env, nc, handler.url):
        await until(lambda: len(applied_order(handler)["a"]) == 6, "the rest applied", 30)
    assert applied_order(handler) == order


async def test_a_head_left_waiting_at_infinity_is_made_due_by_the_drainers_periodic_look(
    env: Env, nc: NATS, handler: ScriptedHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events behind a head wait at 'infinity' until it goes. A head left there for nothing
    (a console login not granted UPDATE discarded the one before it) is found by the
    partition's drainer within STRANDED_EVERY, not only when the partition changes owner."""
    monkeypatch.setattr(ordering_drain, "STRANDED_EVERY", 0.5)
    await ordered_world(env, nc, handler)
    event = envelope(vibe_id="stranded")
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.bound, "the consumer bound")
        conn = await asyncpg.connect(env.dsn("sea"))
        try:
            entry = parking.ParkedEntry(
                message_id=uuid.UUID(event.message_id), ordering_key="stranded",
                stream_seq=1, partition=0, subject=event.subject,
                headers={"Nats-Msg-Id": event.message_id}, data=event.to_wire(),
            )  # fmt: skip
            await parking.park(conn, DURABLE, [entry])
            await conn.execute(
                "UPDATE parked_messages SET next_attempt_at = 'infinity' WHERE message_id = $1",
                entry.message_id,
            )
        finally:
            await conn.close()
        await until(lambda: "stranded" in applied_order(handler), "the stranded head applied", 30)
    assert applied_order(handler)["stranded"] == [event.message_id]
