"""Pausing a durable (``ferry durable pause|resume``, issue 45) against real servers.

While a durable is paused JetStream hands its consumer nothing: events published meanwhile
wait in the stream, a message the consumer had not acknowledged is not redelivered, and
no delivery is spent — counted against the handler's own record of calls and against
JetStream's counters. On resume every waiting event is applied exactly once, on its first
delivery. The pause is audited (who, why, until when), ends by itself at ``--until``, and
an ordered durable's partition consumers pause and resume together.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from shared.contracts.loading import load_topology
from shared.domain.pause import INDEFINITE
from shared.ops import pause as ops
from tests.conftest import CAPS, ROOT, Env, ferry
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


async def publish_many(nc: NATS, count: int, prefix: str) -> list[str]:
    ids = []
    for n in range(count):
        event = envelope(vibe_id=f"{prefix}{n}")
        await publish(nc, event)
        ids.append(event.message_id)
    return ids


def calls_of(handler: ScriptedHandler, ids: list[str]) -> list[dict]:
    wanted = set(ids)
    return [c for c in handler.calls if c["body"]["message_id"] in wanted]


async def test_a_paused_durable_gets_nothing_spends_no_delivery_and_loses_nothing(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, handler={"url": handler.url, "timeout": "20s"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    js = nc.jetstream()
    before = await publish_many(nc, 10, "before")
    async with RunningConsumer(env, nc, handler.url):
        await eventually(lambda: _all(handler, before), timeout=30, what="the first 10 applied")
        done = await asyncio.to_thread(
            ferry, env, "durable", "pause", "--durable", DURABLE,
            "--reason", "handler team deploys a fix", "--actor", "ops",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "paused until resumed" in done.stdout
        during = await publish_many(nc, 30, "during")
        # Longer than the durable's ack_wait (3 s): a delivery would have been made, and a
        # message held unacknowledged would have been redelivered, by now.
        await asyncio.sleep(5.0)
        assert calls_of(handler, during) == [], "a paused durable's handler was called"
        info = await js.consumer_info(STREAM, DURABLE)
        assert info.paused
        assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (30, 0, 0)

        shown = await asyncio.to_thread(
            ferry, env, "durable", "pause", "--durable", DURABLE, "--status", "--json"
        )
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["paused"] is True and doc["partly_paused"] is False
        assert doc["consumers"] == [
            {"name": DURABLE, "paused": True, "until": INDEFINITE.isoformat(), "error": None}
        ]
        assert doc["actions"][0]["actor"] == "ops"
        assert doc["actions"][0]["reason"] == "handler team deploys a fix"

        done = await asyncio.to_thread(
            ferry, env, "durable", "resume", "--durable", DURABLE,
            "--reason", "fix deployed", "--actor", "ops",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        await eventually(lambda: _all(handler, during), timeout=30, what="the 30 applied")
    # Each of the 40 applied once, each on its first delivery: nothing lost, none spent.
    every = before + during
    assert all(handler.applied[mid] == 1 for mid in every)
    calls = calls_of(handler, every)
    assert len(calls) == len(every)
    assert {c["body"]["delivery"]["attempt"] for c in calls} == {1}
    info = await js.consumer_info(STREAM, DURABLE)
    assert not info.paused and info.num_redelivered == 0
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        rows = await conn.fetch(
            "SELECT action, until, actor, reason FROM pause_actions WHERE durable = $1 ORDER BY id",
            DURABLE,
        )
    finally:
        await conn.close()
    assert [(r["action"], r["actor"], r["reason"]) for r in rows] == [
        ("pause", "ops", "handler team deploys a fix"),
        ("resume", "ops", "fix deployed"),
    ]
    assert rows[0]["until"] == INDEFINITE and rows[1]["until"] is None


async def test_a_message_in_hand_is_finished_and_a_timed_pause_ends_by_itself(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    """The handler is slow: a message already delivered when the pause begins is finished
    and acknowledged (not redelivered after the pause); a pause ``--until 4s`` ends by
    itself and what waited is then applied."""
    fast_durable(env, handler.url, handler={"url": handler.url, "timeout": "20s"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    js = nc.jetstream()
    handler.delay = 2.0
    async with RunningConsumer(env, nc, handler.url, concurrency=1):
        (first,) = await publish_many(nc, 1, "slow")
        await eventually(
            lambda: _called(handler, first), timeout=15, what="the first message in hand"
        )
        done = await asyncio.to_thread(
            ferry, env, "durable", "pause", "--durable", DURABLE, "--until", "15s",
            "--reason", "downstream maintenance",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "paused until 20" in done.stdout  # a time, not "until resumed"
        later = await publish_many(nc, 5, "later")
        await eventually(lambda: _all(handler, [first]), timeout=15, what="the held one done")
        # Acknowledged while paused: not waiting to be redelivered after it.
        await eventually(lambda: _acked(js), timeout=10, what="the held one acknowledged")
        assert (await js.consumer_info(STREAM, DURABLE)).paused
        assert calls_of(handler, later) == []
        handler.delay = 0.0
        await eventually(
            lambda: _all(handler, later), timeout=45, what="the 5 after the pause ended"
        )
    calls = calls_of(handler, [first, *later])
    assert len(calls) == 6 and {c["body"]["delivery"]["attempt"] for c in calls} == {1}


async def test_an_ordered_durables_partitions_pause_and_resume_together(
    tmp_path: Path, nc: NATS
) -> None:
    topology = load_topology(ROOT / "topologies/mediation.yaml")
    js = nc.jetstream()
    await provision(js, topology, caps=CAPS)
    spec = topology.durables["cg_g_archive"]
    names = [plan.name for plan in topology.consumers("cg_g_archive")]
    assert len(names) == 4
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    assert await ops._each(js, spec.stream, names, until) == {}
    states = [await ops.read_pause(js, spec.stream, n) for n in names]
    assert [(s.paused, s.until) for s in states] == [(True, until)] * 4
    other = await ops.read_pause(js, spec.stream, "cg_f_ingest")
    assert not other.paused  # only the durable's own consumers
    failed = await ops._each(js, spec.stream, [*names, "no_such_consumer"], INDEFINITE)
    assert list(failed) == ["no_such_consumer"]
    assert await ops._each(js, spec.stream, names, datetime(1970, 1, 1, tzinfo=UTC)) == {}
    assert not any([(await ops.read_pause(js, spec.stream, n)).paused for n in names])


def test_the_commands_refuse_what_they_cannot_do(env: Env) -> None:
    fast_durable(env, "http://127.0.0.1:9/handle")
    no_reason = ferry(env, "durable", "pause", "--durable", DURABLE)
    assert no_reason.returncode == 2 and "--reason is required" in no_reason.stderr
    past = ferry(env, "durable", "pause", "--durable", DURABLE, "--until",
                 "2020-01-01T00:00:00Z", "--reason", "x")  # fmt: skip
    assert past.returncode == 2 and "not in the future" in past.stderr
    naive = ferry(env, "durable", "pause", "--durable", DURABLE, "--until",
                  "2099-01-01T00:00:00", "--reason", "x")  # fmt: skip
    assert naive.returncode == 2 and "no timezone" in naive.stderr
    unknown = ferry(env, "durable", "pause", "--durable", "nope", "--reason", "x")
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    resume = ferry(env, "durable", "resume", "--durable", DURABLE)
    assert resume.returncode == 2 and "--reason" in resume.stderr


async def _all(handler: ScriptedHandler, ids: list[str]) -> bool:
    return all(handler.applied[mid] for mid in ids)


async def _called(handler: ScriptedHandler, mid: str) -> bool:
    return bool(calls_of(handler, [mid]))


async def _acked(js: object) -> bool:
    info = await js.consumer_info(STREAM, DURABLE)  # type: ignore[attr-defined]
    return bool(info.num_ack_pending == 0)


async def test_jetstream_redelivers_nothing_while_paused_and_counts_no_delivery(
    env: Env, nc: NATS
) -> None:
    """What the pause relies on, at the JetStream level: a message nak'ed with a delay and
    one held past its ack_wait are not redelivered while the consumer is paused (no
    delivery counted); on resume each comes again on its second delivery, not later."""
    fast_durable(env, "http://127.0.0.1:9/handle")
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)
    for n in range(2):
        await publish(nc, envelope(vibe_id=f"raw{n}"))
    sub = await js.pull_subscribe_bind(DURABLE, STREAM)
    nacked, _held_past_its_ack_wait = await sub.fetch(2, timeout=5)
    await nacked.nak(delay=1)
    await ops._each(js, STREAM, [DURABLE], INDEFINITE)
    await asyncio.sleep(5.0)  # past the nak's delay and the held one's ack_wait (3 s)
    with pytest.raises(asyncio.TimeoutError):
        await sub.fetch(1, timeout=1)
    info = await js.consumer_info(STREAM, DURABLE)
    assert (info.num_redelivered, info.num_ack_pending) == (0, 2)
    await ops._each(js, STREAM, [DURABLE], datetime(1970, 1, 1, tzinfo=UTC))
    again = await sub.fetch(2, timeout=10)
    assert sorted(m.metadata.num_delivered for m in again) == [2, 2]
    for m in again:
        await m.ack()
    await sub.unsubscribe()
