"""The outbox-publisher's atomic batches against a real nats-server (2.15, ADR-50).

Counted against the outbox: every row in the stream once, in per-aggregate order, when
batches are stored whole, when the server refuses one (an event id already stored, as
after a crash between PubAck and commit), when the stream takes none, and when a claim
is larger than the server's 1,000 messages per batch.
"""

from __future__ import annotations

import logging

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import api as js_api

from services.outbox_publisher import atomic
from services.outbox_publisher.publisher import build_message
from shared.access.streams import provision, stream_config
from shared.adapters.outbox import OutboxRow
from tests.conftest import CAPS, Env
from tests.helpers import RunningPublisher, eventually, insert_events, stream_messages
from tests.integration.test_outbox_publisher import (
    STREAM,
    _assert_exactly_once_in_order,
    _is_zero,
)

pytestmark = pytest.mark.integration


async def _rows(conn: asyncpg.Connection, limit: int) -> list[OutboxRow]:
    records = await conn.fetch(
        "SELECT id, seq, aggregate_type, aggregate_id, event_type, event_version, "
        "payload::text AS payload, occurred_at, correlation_id, causation_id, traceparent, "
        "tracestate FROM outbox_events ORDER BY seq LIMIT $1",
        limit,
    )
    return [OutboxRow(**dict(r)) for r in records]


async def test_batches_are_stored_whole_once_and_in_order(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    assert (await js.stream_info(STREAM)).config.allow_atomic is True
    await insert_events(sea_conn, 600, aggregates=7)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), js, concurrency=1
    ) as publisher:
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="600 rows published")
    assert publisher.stats.atomic_batches >= 1
    assert publisher.stats.atomic_refused == 0
    assert publisher.stats.published == 600
    msgs = await stream_messages(js, STREAM)
    assert all(m.headers.get(atomic.BATCH_ID) for m in msgs), "a message went one by one"
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_a_batch_holding_a_stored_event_falls_back_and_stores_no_copy(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows whose PubAck came but whose mark did not (a crash before the commit) are in
    the stream already: the server refuses the whole batch, the rows go one by one, and
    the duplicate window drops the copies."""
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    await insert_events(sea_conn, 50, aggregates=5)
    ctx = env.topology.contexts["sea"]
    for row in await _rows(sea_conn, 10):  # what a crash before the commit leaves stored
        subject, body, headers = build_message(row, namespace=ctx.namespace, context="sea")
        await js.publish(subject, body, headers=headers, stream=STREAM)
    caplog.set_level(logging.INFO, logger="ferry.outbox_publisher")
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), js, concurrency=1
    ) as publisher:
        await eventually(lambda: _is_zero(sea_conn), timeout=30, what="50 rows published")
    assert publisher.stats.atomic_refused == 1
    assert publisher.stats.duplicates == 10
    assert "atomic publish batch contains duplicate message id" in caplog.text
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_a_stream_without_allow_atomic_is_published_one_by_one(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream someone created without ``allow_atomic``: one refusal, a warning naming
    the fix, and the publisher goes one by one instead of asking again every batch."""
    js = nc.jetstream()
    spec = env.topology.contexts["sea"].stream
    assert spec is not None
    await js.add_stream(stream_config(spec, CAPS).evolve(allow_atomic=None))
    caplog.set_level(logging.WARNING, logger="ferry.outbox_publisher")
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), js, batch_size=20, concurrency=1, atomic_min_rows=1
    ) as publisher:
        for _ in range(3):
            await insert_events(sea_conn, 40, aggregates=4)
            await eventually(lambda: _is_zero(sea_conn), timeout=30, what="rows published")
    assert publisher.stats.atomic_refused == 1
    assert publisher.stats.atomic_batches == 0
    assert "takes no atomic batches" in caplog.text and "allow_atomic" in caplog.text
    await _assert_exactly_once_in_order(nc, sea_conn)
    # Provisioning reports the missing setting and sets it.
    changes = await provision(js, env.topology, caps=CAPS)
    assert any(
        c.name == STREAM and c.action == "updated" and "allow_atomic" in c.diffs for c in changes
    ), [c.describe() for c in changes]
    assert (await js.stream_info(STREAM)).config.allow_atomic is True


async def test_a_claim_under_the_minimum_goes_one_by_one(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    """At a moderate rate claims are small, and an atomic batch costs more than it saves
    below atomic.MIN_ROWS messages: such claims are published one by one."""
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    async with RunningPublisher(env.topology, "sea", env.dsn("sea"), js) as publisher:
        assert publisher.atomic_min_rows == atomic.MIN_ROWS
        for _ in range(3):
            await insert_events(sea_conn, atomic.MIN_ROWS - 1, aggregates=5)
            await eventually(lambda: _is_zero(sea_conn), timeout=30, what="rows published")
    assert publisher.stats.atomic_batches == 0 and publisher.stats.atomic_refused == 0
    msgs = await stream_messages(js, STREAM)
    assert len(msgs) == 3 * (atomic.MIN_ROWS - 1)
    assert not any(m.headers.get(atomic.BATCH_ID) for m in msgs)
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_a_claim_over_the_server_limit_goes_in_consecutive_batches(
    env: Env, nc: NATS, sea_conn: asyncpg.Connection
) -> None:
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    await insert_events(sea_conn, 2500, aggregates=3)
    async with RunningPublisher(
        env.topology, "sea", env.dsn("sea"), js, batch_size=2500, concurrency=1
    ) as publisher:
        await eventually(lambda: _is_zero(sea_conn), timeout=60, what="2500 rows published")
    assert publisher.stats.atomic_batches >= 3  # 1,000 + 1,000 + 500 at least
    assert publisher.stats.atomic_refused == 0
    await _assert_exactly_once_in_order(nc, sea_conn)


async def test_a_stored_batch_reads_as_stored_and_a_refusal_names_why(env: Env, nc: NATS) -> None:
    """The protocol itself, against the server: a PubAck naming the batch and its count is
    stored; a duplicate id refuses the whole batch and stores nothing of it."""
    js = nc.jetstream()
    await js.add_stream(js_api.StreamConfig(name="ATOM", subjects=["atom.>"], allow_atomic=True))
    first = [(f"atom.{i}", b"{}", {"Nats-Msg-Id": f"m{i}"}) for i in range(5)]
    assert await atomic.publish(nc, first, stream="ATOM", timeout=5) is None
    again = [(f"atom.{i}", b"{}", {"Nats-Msg-Id": f"m{i}"}) for i in range(4, 8)]
    refused = await atomic.publish(nc, again, stream="ATOM", timeout=5)
    assert refused is not None and not refused.unsupported
    assert "duplicate message id" in refused.reason
    assert (await js.stream_info("ATOM")).state.messages == 5
    wrong = await atomic.publish(nc, first[:1], stream="OTHER", timeout=5)
    assert wrong is not None and "expected stream" in wrong.reason
    await js.add_stream(js_api.StreamConfig(name="PLAIN", subjects=["plain.>"]))
    plain = await atomic.publish(nc, [("plain.a", b"{}", {})], stream="PLAIN", timeout=5)
    assert plain is not None and plain.unsupported
    assert (await js.stream_info("PLAIN")).state.messages == 0
