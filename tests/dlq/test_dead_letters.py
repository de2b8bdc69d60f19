"""Dead letters end to end on real servers: one record per message, replays, policies.

The scripted handler is the independent record: it logs every call (no deduplication)
and applies each id at most once. Counts come from it, from the dead-letter stream and
from the databases — never from the roles' own counters alone.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, ROOT, Env
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    dead_letters,
    envelope,
    fast_durable,
    inbox_row,
    publish,
)
from tests.helpers import RunningReplayer, RunningRouter, eventually, stream_messages

pytestmark = pytest.mark.integration


def dsns(env: Env) -> dict[str, str]:
    return {env.topology.contexts[c].database: env.dsn(c) for c in env.topology.contexts}


async def rows(env: Env, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def dead_letter(env: Env, message_id: str) -> asyncpg.Record | None:
    found = await rows(
        env,
        "SELECT * FROM dead_letters WHERE durable = $1 AND message_id = $2",
        DURABLE,
        uuid.UUID(message_id),
    )
    return found[0] if found else None


async def status_is(env: Env, message_id: str, status: str) -> bool:
    row = await dead_letter(env, message_id)
    return row is not None and row["status"] == status


async def actions(env: Env, message_id: str) -> list[str]:
    found = await rows(
        env,
        "SELECT action FROM dead_letter_actions WHERE message_id = $1 ORDER BY id",
        uuid.UUID(message_id),
    )
    return [r["action"] for r in found]


async def replays_in_stream(nc: NATS) -> list[Any]:
    return [m for m in await stream_messages(nc.jetstream(), STREAM) if "replay" in m.subject]


async def test_422_gives_exactly_one_record_whichever_path_sees_it(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [422]
    async with (
        RunningConsumer(world, nc, handler.url) as consumer,
        RunningRouter(world.topology, dsns(world), nc.jetstream()) as router,
    ):
        await publish(nc, event)
        # The consumer records it and terms the message; the MSG_TERMINATED advisory
        # then reaches the router, which finds the record and writes nothing.
        await eventually(lambda: _true(router.stats.already == 1), timeout=30, what="advisory seen")
    assert consumer.stats.dead_lettered == 1 and router.stats.recorded == 0
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "HANDLER_REJECTED" and record["source"] == "consumer"
    row = await dead_letter(world, event.message_id)
    assert row is not None and row["status"] == "dead" and row["generation"] == 1
    inbox = await inbox_row(world, event.message_id)
    assert inbox is not None and inbox["status"] == "failed"
    assert json.loads(inbox["dlq_metadata"])["reason"] == "HANDLER_REJECTED"
    assert len(handler.calls) == 1


async def test_always_500_is_dead_lettered_by_the_advisory_with_its_history(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [500, 502, 503, 500]
    async with (
        RunningConsumer(world, nc, handler.url),
        RunningRouter(world.topology, dsns(world), nc.jetstream()) as router,
    ):
        await publish(nc, event)
        await eventually(
            lambda: status_is(world, event.message_id, "dead"), timeout=30, what="recorded"
        )
    assert router.stats.recorded == 1
    [record] = await dead_letters(nc)
    assert record["source"] == "advisory:max_deliveries"
    assert record["reasonCode"] == "MAX_DELIVERIES_EXCEEDED" and record["attempts"] == 4
    assert [h["status"] for h in record["retryHistory"]] == [500, 502, 503, 500]
    assert record["lastError"].startswith("handler answered 500")
    assert record["payload"]["message_id"] == event.message_id
    assert len(handler.calls) == 4


async def test_router_down_while_failures_happen_records_them_when_back(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    events = [envelope() for _ in range(5)]
    for event in events:
        handler.scripts[event.message_id] = [500] * 4
    async with RunningConsumer(world, nc, handler.url) as consumer:
        await asyncio.gather(*(publish(nc, e) for e in events))
        await eventually(
            lambda: _true(consumer.stats.exhausted == 5), timeout=30, what="all exhausted"
        )
    assert await dead_letters(nc) == []  # nobody routed them yet: they wait as advisories
    async with RunningRouter(world.topology, dsns(world), nc.jetstream()) as router:
        await eventually(lambda: _true(router.stats.recorded == 5), timeout=30, what="records")
    records = await dead_letters(nc)
    assert sorted(r["message_id"] for r in records) == sorted(e.message_id for e in events)


def _spawn_consumer(env: Env, url: str) -> subprocess.Popen[bytes]:
    extra = {
        "FERRY_DURABLE": DURABLE,
        "FERRY_HANDLER_URL": url,
        "FERRY_FETCH_TIMEOUT": "0.2",
        "FERRY_LEASE_MARGIN": "0.5",
    }
    with open(env.tmp_path / "consumer.log", "ab") as log:
        return subprocess.Popen(
            argv := [sys.executable, "-m", "services.inbox_consumer"],
            cwd=ROOT,
            env=env.settings_env(command=argv, **extra),
            stdout=log,
            stderr=log,
        )


async def test_consumer_killed_on_every_delivery_is_dead_lettered(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(
        env,
        handler.url,
        ack_wait="2s",
        max_deliver=3,
        handler={"url": handler.url, "timeout": "1s"},
    )
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [30.0] * 3  # never answers before the kill
    await publish(nc, event)
    for delivery in range(1, 4):
        proc = _spawn_consumer(env, handler.url)
        try:
            await eventually(
                lambda n=delivery: _true(len(handler.calls) >= n), timeout=30, what="a call"
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 10)
    # Restarted once more (as supervisord would): JetStream notices the exhausted message
    # when the next pull arrives, and emits MAX_DELIVERIES instead of a fourth delivery.
    proc = _spawn_consumer(env, handler.url)
    try:
        async with RunningRouter(env.topology, dsns(env), nc.jetstream()) as router:
            await eventually(
                lambda: status_is(env, event.message_id, "dead"), timeout=30, what="recorded"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 20)
    assert router.stats.recorded == 1 and len(handler.calls) == 3
    [record] = await dead_letters(nc)
    assert record["reasonCode"] == "MAX_DELIVERIES_EXCEEDED" and record["attempts"] == 3
    assert "no outcome recorded" in record["lastError"]
    assert handler.applied[event.message_id] == 0


async def test_automatic_replay_after_the_fix_processes_exactly_once(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, replay_limits={"base_delay": "300ms", "max_delay": "1s"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [503] * 4  # broken for four deliveries, then fixed
    async with (
        RunningConsumer(env, nc, handler.url),
        RunningRouter(env.topology, dsns(env), nc.jetstream()),
        RunningReplayer(env.topology, dsns(env), nc.jetstream()) as replayer,
    ):
        await publish(nc, event)
        await eventually(
            lambda: status_is(env, event.message_id, "replayed"), timeout=30, what="replayed"
        )
    assert replayer.stats.replayed == 1
    assert handler.applied[event.message_id] == 1
    assert len(handler.calls) == 5  # four failures, one success on the replay
    replayed = handler.calls[-1]["body"]
    assert replayed["message_id"] == event.message_id and replayed["subject"] == event.subject
    inbox = await inbox_row(env, event.message_id)
    assert inbox is not None and inbox["status"] == "processed"
    assert json.loads(inbox["dlq_metadata"])["replay_attempts"] == 1
    assert await actions(env, event.message_id) == ["auto_replay"]
    [replay] = await replays_in_stream(nc)
    assert replay.subject == f"ferry.replay.{STREAM}.{DURABLE}"
    assert replay.headers["Nats-Msg-Id"] == f"replay:{DURABLE}:{event.message_id}:1"


async def test_replays_stop_at_the_cap_and_the_entry_is_parked(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(
        env,
        handler.url,
        replay_limits={"base_delay": "100ms", "max_delay": "300ms", "max_attempts": 2},
    )
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [422] * 10  # the handler never accepts it
    async with (
        RunningConsumer(env, nc, handler.url),
        RunningRouter(env.topology, dsns(env), nc.jetstream()),
        RunningReplayer(env.topology, dsns(env), nc.jetstream()) as replayer,
    ):
        await publish(nc, event)
        await eventually(
            lambda: status_is(env, event.message_id, "parked"), timeout=30, what="parked"
        )
        await asyncio.sleep(1.0)  # a few more scans: a parked entry is left alone
    assert replayer.stats.replayed == 2
    assert len(handler.calls) == 3  # the original and two replays
    row = await dead_letter(env, event.message_id)
    assert row is not None and row["generation"] == 3 and row["replay_attempts"] == 2
    assert await actions(env, event.message_id) == ["auto_replay", "auto_replay", "auto_park"]
    assert len(await dead_letters(nc)) == 3  # one record per generation


async def test_operator_policy_never_replays_on_its_own(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, replay="operator", replay_limits={"base_delay": "10ms"})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [422]
    async with (
        RunningConsumer(env, nc, handler.url),
        RunningReplayer(env.topology, dsns(env), nc.jetstream()) as replayer,
    ):
        await publish(nc, event)
        await eventually(lambda: status_is(env, event.message_id, "held"), timeout=30, what="held")
        scans = replayer.stats.scans
        await eventually(
            lambda: _true(replayer.stats.scans >= scans + 5), timeout=30, what="more scans"
        )
    assert replayer.stats.replayed == 0 and await replays_in_stream(nc) == []
    assert await actions(env, event.message_id) == []
    assert len(handler.calls) == 1


async def test_a_replay_reaches_only_the_durable_that_failed(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    # A second durable on the same stream, into the same database, with its own handler
    # (the scripted one tells them apart by the durable in the request).
    fast_durable(env, handler.url, replay_limits={"base_delay": "200ms", "max_delay": "300ms"})
    twin = dict(env.doc["durables"][DURABLE])
    env.doc["durables"]["audit__from_vibespro"] = {
        **twin,
        "dead_letter_subject": "sea.dlq.audit__from_vibespro",
    }
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [422]  # the first call (whichever durable) fails
    async with (
        RunningConsumer(env, nc, handler.url),
        RunningConsumer(env, nc, handler.url, durable="audit__from_vibespro"),
        RunningRouter(env.topology, dsns(env), nc.jetstream()),
        RunningReplayer(env.topology, dsns(env), nc.jetstream()),
    ):
        await publish(nc, event)
        failed = await _first_failed(env, event.message_id)
        other = "audit__from_vibespro" if failed == DURABLE else DURABLE
        await eventually(
            lambda: _status(env, failed, event.message_id, "replayed"), timeout=30, what="replayed"
        )
    by_durable: dict[str, int] = {}
    for call in handler.calls:
        name = call["body"]["delivery"]["durable"]
        by_durable[name] = by_durable.get(name, 0) + 1
    assert by_durable == {failed: 2, other: 1}
    [row] = await rows(
        env,
        "SELECT duplicates FROM inbox_messages WHERE durable = $1 AND message_id = $2",
        other,
        uuid.UUID(event.message_id),
    )
    assert row["duplicates"] == 0  # the replay was never even delivered to it


async def _first_failed(env: Env, message_id: str) -> str:
    found: list[str] = []

    async def check() -> bool:
        hit = await rows(
            env,
            "SELECT durable FROM dead_letters WHERE message_id = $1",
            uuid.UUID(message_id),
        )
        found[:] = [r["durable"] for r in hit]
        return bool(found)

    await eventually(check, timeout=30, what="a dead letter")
    [durable] = found
    return durable


async def _status(env: Env, durable: str, message_id: str, status: str) -> bool:
    hit = await rows(
        env,
        "SELECT status FROM dead_letters WHERE durable = $1 AND message_id = $2",
        durable,
        uuid.UUID(message_id),
    )
    return bool(hit) and hit[0]["status"] == status


async def _true(value: bool) -> bool:
    return value
