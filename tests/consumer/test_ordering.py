"""``ordering: key`` (issue 23): one key at a time in stream order, keys in parallel, and
sequenced parking of a failed event's key — retries, dead letters held or skipped,
replays and discards, restarts — counted against the scripted handler's own record."""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from shared.adapters import parked_queue
from shared.adapters.dead_letters.replay import replay
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    ScriptedHandler,
    dead_letters,
    envelope,
    fast_durable,
    publish,
)
from tests.helpers import eventually


async def ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``ferry`` command against the test's servers."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        env=env.settings_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def ordered_world(env: Env, nc: NATS, handler: ScriptedHandler, **overrides: Any) -> None:
    fast_durable(env, handler.url, ordering="key", **overrides)
    await provision(nc.jetstream(), env.topology, caps=CAPS)


async def publish_keys(nc: NATS, keys: list[str], per_key: int) -> dict[str, list[str]]:
    """``per_key`` events for each key, interleaved; the ids per key in publish order."""
    order: dict[str, list[str]] = defaultdict(list)
    for index in range(per_key):
        for key in keys:
            event = envelope(vibe_id=key, title=f"{key}-{index}")
            order[key].append(event.message_id)
            await publish(nc, event)
    return order


def applied_order(handler: ScriptedHandler) -> dict[str, list[str]]:
    """Per key, the ids the handler applied (answered 200 the first time), in call order."""
    order: dict[str, list[str]] = defaultdict(list)
    for call in handler.calls:
        if call.get("outcome") == 200:
            order[call["body"]["aggregate_id"]].append(call["body"]["message_id"])
    return dict(order)


async def until(check: Callable[[], Any], what: str, timeout: float = 30) -> None:
    """Poll ``check`` (plain or async) until true."""

    async def poll() -> bool:
        value = check()
        return bool(await value if inspect.isawaitable(value) else value)

    await eventually(poll, timeout=timeout, what=what)


async def parked_rows(env: Env) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return await conn.fetch(
            "SELECT * FROM parked_messages WHERE durable = $1 ORDER BY ordering_key, stream_seq",
            DURABLE,
        )
    finally:
        await conn.close()


async def test_each_key_in_stream_order_and_keys_in_parallel(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler)
    rng = random.Random(7)
    keys = [f"k{i}" for i in range(12)]
    order = await publish_keys(nc, keys, per_key=8)
    for ids in order.values():  # random handler latencies would reorder a parallel consumer
        for mid in ids:
            handler.scripts[mid] = [rng.choice([0.0, 0.01, 0.03])]
    async with RunningConsumer(env, nc, handler.url, concurrency=8) as consumer:
        await until(lambda: consumer.stats.processed == 96, "consumer.stats.processed == 96", 60)
    assert applied_order(handler) == order
    assert handler.max_in_flight > 1, "different keys must run in parallel"
    assert handler.max_in_flight_per_key == 1, "one key's events must not overlap"


async def test_a_retrying_event_holds_back_only_its_own_key(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler, backoff=["1s", "1s", "1s"], max_deliver=6)
    order = await publish_keys(nc, ["slow", "fast"], per_key=5)
    head = order["slow"][0]
    handler.scripts[head] = [503, 503, 200]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 10, "consumer.stats.processed == 10", 60)
        assert consumer.stats.parked >= 5  # the head and the four behind it
    assert applied_order(handler) == order
    fast_done = max(c["at"] for c in handler.calls if c["body"]["aggregate_id"] == "fast")
    head_done = max(c["at"] for c in handler.calls if c["body"]["message_id"] == head)
    assert fast_done < head_done, "the other key must not wait for the failing one"
    assert [c["outcome"] for c in handler.calls_for(head)] == [503, 503, 200]
    assert await parked_rows(env) == []


async def test_a_held_dead_letter_parks_its_key_until_replayed(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="hold")
    order = await publish_keys(nc, ["held", "free"], per_key=4)
    head = order["held"][0]
    handler.scripts[head] = [422]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 4, "consumer.stats.processed == 4", 30)
        await until(
            lambda: len(handler.calls_for(head)) == 1, "len(handler.calls_for(head)) == 1", 10
        )
        rows = await eventually_rows(env, 4)
        assert [r["message_id"] for r in rows] == [uuid.UUID(m) for m in order["held"]]
        assert [r["state"] for r in rows] == ["held", "queued", "queued", "queued"]
        record = next(r for r in await dead_letters(nc) if r["message_id"] == head)
        assert record["ordering"] == {"key": "vibe/held", "policy": "hold", "held": True}
        await asyncio.sleep(1.0)  # nothing of the held key moves meanwhile
        assert [c for c in handler.calls if c["body"]["aggregate_id"] == "held"] == [
            c for c in handler.calls_for(head)
        ]
        conn = await asyncpg.connect(env.dsn("sea"))
        try:
            summary = await parked_queue.summary(conn, DURABLE)
            assert (summary["keys"], summary["events"], summary["held"]) == (1, 4, 1)
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
        await until(lambda: consumer.stats.processed == 8, "consumer.stats.processed == 8", 30)
    assert applied_order(handler) == order
    assert await parked_rows(env) == []
    # The events that waited behind the held head say so on their inbox rows (the KPI job
    # gives their latency apart); the head (a replay) and the free key's events do not.
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        rows = await conn.fetch(
            "SELECT message_id::text AS id, held_by::text AS held_by FROM inbox_messages"
            " WHERE durable = $1",
            DURABLE,
        )
    finally:
        await conn.close()
    held_by = {r["id"]: r["held_by"] for r in rows}
    assert {m: held_by[m] for m in order["held"]} == {
        m: (None if m == head else head) for m in order["held"]
    }
    assert all(held_by[m] is None for m in order["free"])


async def test_discarding_a_held_head_lets_the_rest_of_its_key_go(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="hold")
    order = await publish_keys(nc, ["held"], per_key=3)
    head = order["held"][0]
    handler.scripts[head] = [422]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await eventually_rows(env, 3)
        listed = await ferry(env, "parked", "list", "--durable", DURABLE, "--json")
        assert listed.returncode == 0, listed.stderr
        doc = json.loads(listed.stdout)
        assert (doc["keys"], doc["events"], doc["held_keys"]) == (1, 3, 1)
        [key] = doc["parked"]
        assert (key["ordering_key"], key["head_id"], key["head_state"]) == (
            "vibe/held",
            head,
            "held",
        )
        assert key["waiting_behind"] == 2
        shown = await ferry(env, "dlq", "show", DURABLE, head)
        assert shown.returncode == 0, shown.stderr
        assert "key vibe/held (on_dead_letter: hold)" in shown.stdout
        assert "parked behind this dead letter (held): 2 event(s) waiting" in shown.stdout
        shown_json = json.loads((await ferry(env, "dlq", "show", DURABLE, head, "--json")).stdout)
        assert shown_json["ordering"]["parked"]["waiting_behind_head"] == 2
        not_held = await ferry(
            env, "parked", "discard", "--durable", DURABLE, "--key", "vibe/nope", "--reason", "x"
        )
        assert not_held.returncode == 1 and "has no held head" in not_held.stderr
        gone = await ferry(
            env, "parked", "discard", "--durable", DURABLE, "--key", "vibe/held",
            "--reason", "obsolete", "--actor", "test",
        )  # fmt: skip
        assert gone.returncode == 0, gone.stderr
        assert head in gone.stdout
        conn = await asyncpg.connect(env.dsn("sea"))
        try:
            actions = await conn.fetch("SELECT action, actor, reason FROM parked_actions")
            assert [tuple(a) for a in actions] == [("discard", "test", "obsolete")]
        finally:
            await conn.close()
        await until(lambda: consumer.stats.processed == 2, "consumer.stats.processed == 2", 30)
    assert applied_order(handler)["held"] == order["held"][1:]


async def test_skip_lets_the_key_go_on_and_records_the_broken_order(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="skip", replay="operator")
    order = await publish_keys(nc, ["k"], per_key=4)
    head = order["k"][1]
    handler.scripts[head] = [422]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 3, "consumer.stats.processed == 3", 30)
    assert applied_order(handler)["k"] == [m for m in order["k"] if m != head]
    record = next(r for r in await dead_letters(nc) if r["message_id"] == head)
    assert record["ordering"] == {"key": "vibe/k", "policy": "skip", "order_broken_after": True}
    assert await parked_rows(env) == []


async def test_parked_keys_survive_a_restart(env: Env, nc: NATS, handler: ScriptedHandler) -> None:
    await ordered_world(env, nc, handler, backoff=["2s", "2s", "2s"], max_deliver=6)
    order = await publish_keys(nc, ["a", "b"], per_key=3)
    head = order["a"][0]
    handler.scripts[head] = [503, 200]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.parked >= 3, "consumer.stats.parked >= 3", 30)
    assert len(await parked_rows(env)) == 3
    late = await publish_keys(nc, ["a"], per_key=2)  # arrive while "a" is parked
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 5, "consumer.stats.processed == 5", 30)
    assert applied_order(handler)["a"] == order["a"] + late["a"]
    assert applied_order(handler)["b"] == order["b"]
    assert await parked_rows(env) == []


async def test_an_event_without_its_key_field_is_dead_lettered_and_the_rest_goes_on(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler)
    bad = envelope(vibe_id="x")
    doc = json.loads(bad.to_wire())
    doc["aggregate_id"] = ""
    await nc.jetstream().publish(
        bad.subject, json.dumps(doc).encode(), headers={"Nats-Msg-Id": bad.message_id}
    )
    order = await publish_keys(nc, ["ok"], per_key=2)
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 2, "consumer.stats.processed == 2", 30)
        await until(
            lambda: consumer.stats.dead_lettered == 1, "consumer.stats.dead_lettered == 1", 30
        )
    assert applied_order(handler)["ok"] == order["ok"]


async def eventually_rows(env: Env, count: int) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = []

    async def enough() -> bool:
        rows[:] = await parked_rows(env)
        return len(rows) == count

    await eventually(enough, timeout=30, what=f"{count} parked rows")
    return rows


async def test_discarding_the_dead_letter_of_a_held_head_releases_its_key(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await ordered_world(env, nc, handler, on_dead_letter="hold")
    order = await publish_keys(nc, ["held"], per_key=3)
    head = order["held"][0]
    handler.scripts[head] = [422]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await eventually_rows(env, 3)
        gone = await ferry(env, "dlq", "discard", DURABLE, head, "--reason", "obsolete")
        assert gone.returncode == 0, gone.stderr
        assert "released key vibe/held" in gone.stdout
        await until(lambda: consumer.stats.processed == 2, "the two behind it processed")
    assert applied_order(handler)["held"] == order["held"][1:]
    assert await parked_rows(env) == []
