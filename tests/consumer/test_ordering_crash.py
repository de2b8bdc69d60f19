"""``on_dead_letter: hold`` across a crash between the dead letter and the parking of its key.

The consumer records a held head's dead letter (and terms the message) in one step and
parks the key's later events in the next. A consumer killed between the two must not let
the later events go on when they are redelivered: the key is held until the operator
replays or discards the head, whoever consumes the partition next.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from services.inbox_consumer.ordering import Drainer, Sequencer
from shared.adapters.dead_letters.replay import replay
from tests.conftest import Env, admin_auth
from tests.consumer.conftest import DURABLE, RunningConsumer, ScriptedHandler
from tests.consumer.test_ordering import (
    applied_order,
    eventually_rows,
    ordered_world,
    publish_keys,
    until,
)


async def killed_when(
    env: Env,
    nats_server: NatsServer,
    handler: ScriptedHandler,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
) -> None:
    """Run a consumer until it calls ``Sequencer._park`` (the JetStream path) or
    ``Drainer._retry_row`` (the drainer) with ``state="held"``, and kill it there: its
    connections cut at once, nothing more written or acked."""
    reached = asyncio.Event()
    owner: type[Any] = Drainer if method == "_retry_row" else Sequencer
    real = getattr(owner, method)

    async def dies_there(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("state", args[1] if method == "_retry_row" else None) == "held":
            reached.set()
            await asyncio.Event().wait()  # the process dies here
        await real(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, dies_there)
    own = await nats.connect(nats_server.url, **admin_auth(nats_server).options([nats_server.url]))
    first = RunningConsumer(env, own, handler.url)
    await first.__aenter__()
    await asyncio.wait_for(reached.wait(), timeout=30)
    first.task.cancel()
    first.pool.terminate()
    await own.close()
    await asyncio.wait([first.task], timeout=5)
    await first.http.close()
    monkeypatch.setattr(owner, method, real)


async def held_then_replayed(
    env: Env, nc: NATS, handler: ScriptedHandler, order: dict[str, list[str]]
) -> None:
    """A fresh consumer: the key's later events wait behind its held head until it is
    replayed, then everything is applied in order."""
    head = order["held"][0]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        # The later events come back once their ack_wait (3 s) has run out, or are in
        # parked_messages already...
        await asyncio.sleep(6)
        # ...and wait behind the held head: none of them reached the handler.
        later = [c for m in order["held"][1:] for c in handler.calls_for(m)]
        assert later == [], "the key went on past a held dead letter"
        rows = await eventually_rows(env, 3)
        assert [r["state"] for r in rows] == ["held", "queued", "queued"]
        conn = await asyncpg.connect(env.dsn("sea"))
        try:
            await replay(
                conn,
                nc.jetstream(),
                durable=DURABLE,
                message_id=uuid.UUID(head),
                actor="test",
                reason="fixed",
                automatic=False,
                topology=env.topology,
            )
        finally:
            await conn.close()
        await until(lambda: consumer.stats.processed >= 3, "the key released in order", 30)
    assert applied_order(handler)["held"] == order["held"]


async def test_a_kill_between_the_dead_letter_and_the_park_still_holds_the_key(
    env: Env,
    nc: NATS,
    nats_server: NatsServer,
    handler: ScriptedHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="hold")
    order = await publish_keys(nc, ["held"], per_key=3)
    handler.scripts[order["held"][0]] = [422, 200]
    await killed_when(env, nats_server, handler, monkeypatch, "_park")
    await held_then_replayed(env, nc, handler, order)


async def test_a_kill_between_a_parked_heads_dead_letter_and_its_hold_still_holds_the_key(
    env: Env,
    nc: NATS,
    nats_server: NatsServer,
    handler: ScriptedHandler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="hold")
    order = await publish_keys(nc, ["held"], per_key=3)
    # Retried once from parked_messages by the drainer, then dead-lettered there.
    handler.scripts[order["held"][0]] = [503, 422, 200]
    await killed_when(env, nats_server, handler, monkeypatch, "_retry_row")
    await held_then_replayed(env, nc, handler, order)
