"""The sweep: an exhaustion whose MAX_DELIVERIES advisory was never captured (issue 22).

Exhaustion used to rest on the advisory alone: with the router down and the advisory
lost, the inbox row stayed ``retrying`` for good — no dead letter, no alert. The router's
sweep dead-letters such rows (``DELIVERY_EXHAUSTED_UNREPORTED``) once they are past the
durable's redelivery horizon and JetStream will not deliver them again — exactly once,
however many router replicas sweep at the same time.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from services.dlq_router.sweep import Sweep
from shared.access.streams import provision
from shared.domain.dead_letter import SWEEP_REASON
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    inbox_row,
    publish,
)
from tests.dlq.support import Roles, dead_letter_rows, raw_records, true
from tests.helpers import eventually
from tests.observability.conftest import metric_value

pytestmark = pytest.mark.integration

#: Horizon of the durable below: 1 s x 2 deliveries + 0.1 s of ladder + this margin.
MARGIN = 0.5


async def _purge_advisories(nc: NATS, env: Env) -> None:
    """The advisories are lost (what the sweep exists for)."""
    await nc.jetstream().purge_stream(env.topology.advisory_stream)


async def _spent_without_advisory(env: Env, nc: NATS, handler: ScriptedHandler) -> Any:
    """One event whose both deliveries failed (max_deliver 2), and its advisory lost."""
    fast_durable(env, handler.url, ack_wait="1s", max_deliver=2, backoff=["100ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [500, 500]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await publish(nc, event)
        await eventually(lambda: true(consumer.stats.exhausted == 1), timeout=30, what="exhausted")
    await _purge_advisories(nc, env)
    return event


async def test_an_exhaustion_no_advisory_reported_is_dead_lettered_once_by_the_sweep(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = await _spent_without_advisory(env, nc, handler)
    row = await inbox_row(env, event.message_id)
    assert row is not None and row["status"] == "retrying"
    async with Roles(env, nc.jetstream()) as roles:
        # Two replicas' sweeps (no advisory routing) over the same rows at the same time.
        a, b = roles.sweep(margin=MARGIN), roles.sweep(margin=MARGIN)
        horizon = a.horizon(env.topology.durables["sea__from_vibespro"])
        assert horizon == pytest.approx(2.6)

        async def swept() -> bool:
            counts = await asyncio.gather(a.run_once(), b.run_once())
            return sum(counts) > 0

        await eventually(swept, timeout=30, what="a sweep past the horizon", interval=0.3)
        assert a.stats.recorded + b.stats.recorded == 1
        assert await a.run_once() == 0 and await b.run_once() == 0  # nothing left to do
    [stored] = await dead_letter_rows(env)
    assert stored["reason_code"] == SWEEP_REASON and stored["source"] == "sweep"
    assert stored["message_id"] == uuid.UUID(event.message_id)
    assert stored["attempts"] == 2
    [data] = await raw_records(nc.jetstream())
    record = json.loads(data)
    assert record["reasonCode"] == SWEEP_REASON
    assert record["payload"]["message_id"] == event.message_id
    assert [h["status"] for h in record["retryHistory"]] == [500, 500]
    row = await inbox_row(env, event.message_id)
    assert row is not None and row["status"] == "failed"
    assert json.loads(row["dlq_metadata"])["reason"] == SWEEP_REASON
    assert handler.applied[event.message_id] == 0


async def test_a_spent_message_is_swept_without_waiting_out_the_horizon(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    """Issue 44: a lost advisory left its event to the horizon (7 minutes in the chaos
    run). Its last delivery failed, so JetStream delivers it no more and only the advisory
    is awaited: the sweep takes it after spent_after, however long the horizon. (A message
    with deliveries left keeps the horizon: see the "still holds for redelivery" test.)"""
    await _spent_without_advisory(env, nc, handler)
    async with Roles(env, nc.jetstream()) as roles:
        sweep = roles.sweep(margin=3600.0, spent_after=0.5)  # a horizon of an hour
        assert sweep.horizon(env.topology.durables["sea__from_vibespro"]) > 3600
        await eventually(lambda: _swept_one(sweep), timeout=30, what="swept", interval=0.3)
    [stored] = await dead_letter_rows(env)
    assert stored["reason_code"] == SWEEP_REASON and stored["attempts"] == 2


async def test_a_late_advisory_after_the_sweep_adds_nothing(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, ack_wait="1s", max_deliver=2, backoff=["100ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [500, 500]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await publish(nc, event)
        await eventually(lambda: true(consumer.stats.exhausted == 1), timeout=30, what="exhausted")
    async with Roles(env, nc.jetstream()) as roles:
        sweep = roles.sweep(margin=MARGIN)  # the router is down: its advisory waits
        await eventually(lambda: _swept_one(sweep), timeout=30, what="swept", interval=0.3)
        router = roles.router()
        await eventually(lambda: true(router.stats.already == 1), timeout=30, what="advisory")
        assert router.stats.recorded == 0 and roles.alive()
    assert len(await raw_records(nc.jetstream())) == 1
    assert len(await dead_letter_rows(env)) == 1


async def test_the_sweep_leaves_a_message_jetstream_still_holds_for_redelivery(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    # One failure, then the consumer goes away before the redelivery: the row is untouched
    # past the horizon, but the message is JetStream's until a consumer pulls it again.
    # (A 3 s back-off: the consumer is gone before the redelivery is due.)
    fast_durable(env, handler.url, ack_wait="1s", max_deliver=3, backoff=["3s"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [500]
    async with RunningConsumer(env, nc, handler.url):
        await publish(nc, event)
        await eventually(lambda: true(len(handler.calls) == 1), timeout=30, what="a call")
    async with Roles(env, nc.jetstream()) as roles:
        sweep = roles.sweep(margin=MARGIN)
        await eventually(
            lambda: _held(sweep), timeout=30, what="a sweep past the horizon", interval=0.3
        )
        assert sweep.stats.recorded == 0
    assert await dead_letter_rows(env) == []
    async with RunningConsumer(env, nc, handler.url):  # back: redelivered and processed
        await eventually(
            lambda: true(handler.applied[event.message_id] == 1), timeout=30, what="processed"
        )
    row = await inbox_row(env, event.message_id)
    assert row is not None and row["status"] == "processed"


async def _swept_one(sweep: Sweep) -> bool:
    return await sweep.run_once() == 1


async def _held(sweep: Sweep) -> bool:
    await sweep.run_once()
    return sweep.stats.still_pending >= 1


async def test_the_router_sweeps_on_its_own_and_counts_it(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await _spent_without_advisory(env, nc, handler)
    async with Roles(env, nc.jetstream()) as roles:
        router = roles.router(sweep_margin=MARGIN, sweep_interval=0.5)
        await eventually(lambda: true(router.sweep.stats.recorded == 1), timeout=30, what="swept")
        assert roles.alive()
        text = (await router.metrics.role.render())[0].decode()
    assert (
        metric_value(
            text,
            "ferry_dead_letters_total",
            durable="sea__from_vibespro",
            reason=SWEEP_REASON,
            source="sweep",
        )
        == 1
    )
    assert metric_value(text, "ferry_dlq_router_sweep_total", outcome="recorded") == 1
    assert len(await raw_records(nc.jetstream())) == 1
