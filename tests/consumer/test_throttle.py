"""Controlled throttling (INFRA-005 §7.3) against real servers.

A throttled durable hands its handler about ``rate`` messages a second: 200 events at
5/s are far from all processed after 2 s, and all are processed eventually, each exactly
once on its first delivery (no message waited past its ack_wait, none lost). An operator
override (``ferry durable throttle``, run as the operator runs it) changes the rate of the
running consumer, which reads it through its own database login; clearing it restores
the topology's value. Bounds are wide on purpose: they separate "throttled" from "not
throttled" (40 s against a fraction of a second), never milliseconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from services.inbox_consumer.consumer import ConsumerLoop
from services.inbox_consumer.throttle import Throttle
from shared.access.identities import Identity
from shared.access.streams import provision
from shared.cli import main as cli
from shared.domain.throttle import Limit
from tests.conftest import CAPS, Env, ferry
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


async def throttled_world(env: Env, nc: NATS, handler: ScriptedHandler, **throttle: Any) -> None:
    # ack_wait 3 s (fast_durable): far shorter than a throttled message may wait. A
    # generous handler timeout: a busy machine must not turn a slow answer into a retry
    # (a second handler call the test would blame on the throttle).
    fast_durable(
        env, handler.url, throttle=throttle, handler={"url": handler.url, "timeout": "20s"}
    )
    await provision(nc.jetstream(), env.topology, caps=CAPS)


async def publish_many(nc: NATS, count: int) -> list[str]:
    ids = []
    for n in range(count):
        event = envelope(vibe_id=f"v{n}")
        await publish(nc, event)
        ids.append(event.message_id)
    return ids


def applied(handler: ScriptedHandler, ids: list[str]) -> int:
    return sum(1 for mid in ids if handler.applied[mid])


async def assert_each_processed_once_on_first_delivery(
    nc: NATS, handler: ScriptedHandler, ids: list[str]
) -> None:
    assert all(handler.applied[mid] == 1 for mid in ids), "lost or applied twice"
    calls = [c for c in handler.calls if c["body"]["message_id"] in set(ids)]
    assert len(calls) == len(ids), "a message was delivered to the handler more than once"
    assert {c["body"]["delivery"]["attempt"] for c in calls} == {1}

    async def settled() -> bool:
        info = await nc.jetstream().consumer_info(STREAM, DURABLE)
        assert info.num_redelivered == 0, "JetStream redelivered a message"
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)

    await eventually(settled, timeout=15, what="every message acked")


async def test_a_throttled_durable_processes_at_about_its_rate_and_loses_nothing(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await throttled_world(env, nc, handler, rate="5/s", burst=5)
    ids = await publish_many(nc, 200)
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await eventually(lambda: _some(handler, ids), timeout=15, what="a first message")
        started = applied(handler, ids)
        await asyncio.sleep(2.0)
        # 5/s for 2 s is about 10 more (plus the burst): nowhere near the 200 published.
        assert applied(handler, ids) - started < 60
        await eventually(
            lambda: _all(handler, ids), timeout=120, what="all 200 processed at 5/s", interval=0.5
        )
        assert consumer.throttle.waited > 10  # most of the ~40 s were spent waiting for tokens
        await assert_each_processed_once_on_first_delivery(nc, handler, ids)


async def test_an_override_changes_a_running_consumer_and_clearing_restores_the_topology(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await throttled_world(env, nc, handler, rate="2/s", burst=2)
    database = env.topology.contexts["sea"].database
    await env.grant_roles(database)
    own_login = env.role_dsn(Identity("inbox-consumer", DURABLE), database)
    ids = await publish_many(nc, 200)
    stop = asyncio.Event()
    async with RunningConsumer(env, nc, handler.url, dsn=own_login) as consumer:
        watching = asyncio.create_task(_watch(consumer, stop))
        try:
            await eventually(lambda: _some(handler, ids), timeout=15, what="a first message")
            assert consumer.throttle.limit == Limit(2.0, 2)
            assert applied(handler, ids) < 100  # 2/s: a handful so far
            # At 2/s the 200 would take 100 s; the operator lifts the rate to 1000/s.
            done = await asyncio.to_thread(
                ferry, env, "durable", "throttle", "--durable", DURABLE, "--rate", "1000/s",
                "--burst", "100", "--reason", "catch up after the incident", "--actor", "ops",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            await eventually(
                lambda: _all(handler, ids), timeout=30, what="all 200 at the override's rate"
            )
            assert consumer.throttle.source == "override"
            assert consumer.throttle.limit == Limit(1000.0, 100)
            await assert_each_processed_once_on_first_delivery(nc, handler, ids)

            done = await asyncio.to_thread(
                ferry, env, "durable", "throttle", "--durable", DURABLE, "--clear",
                "--reason", "incident over", "--actor", "ops",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            await eventually(
                lambda: _source(consumer, "topology"), timeout=15, what="the topology's rate back"
            )
            assert consumer.throttle.limit == Limit(2.0, 2)
            more = await publish_many(nc, 40)
            await eventually(lambda: _some(handler, more), timeout=15, what="a first of 40 more")
            await asyncio.sleep(2.0)
            assert applied(handler, more) < 30  # 2/s again: about 6 in 2 s, not 40
        finally:
            stop.set()
            await watching
    shown = await asyncio.to_thread(ferry, env, "durable", "throttle", "--durable", DURABLE)
    assert shown.returncode == 0, shown.stderr
    assert "in force: 2/s (burst 2)" in shown.stdout
    assert "catch up after the incident" in shown.stdout and "incident over" in shown.stdout
    assert "set 1000/s" in shown.stdout and "clear" in shown.stdout


async def test_the_limit_is_shared_by_the_durables_live_processes(env: Env) -> None:
    """Two consumer processes of one durable (their own database login) each take half
    of its limit; when one stops, the other takes it all at its next poll."""
    fast_durable(env, "http://127.0.0.1:9/handle", throttle={"rate": "10/s", "burst": 10})
    database = env.topology.contexts["sea"].database
    await env.grant_roles(database)
    pool = await asyncpg.create_pool(
        env.role_dsn(Identity("inbox-consumer", DURABLE), database), min_size=1, max_size=4
    )
    spec = env.topology.durables[DURABLE]
    one, two = Throttle(DURABLE, spec), Throttle(DURABLE, spec)
    stop_two = asyncio.Event()
    try:
        async with pool.acquire() as conn:
            await one.refresh(conn)
        watching = asyncio.create_task(two.watch(pool, stop_two, interval=0.2))

        async def halved() -> bool:
            async with pool.acquire() as conn:
                await one.refresh(conn)
            return one.members == two.members == 2

        await eventually(halved, timeout=10, what="both processes counted")
        assert one.limit == two.limit == Limit(10.0, 10)
        assert one.share == two.share == Limit(5.0, 5)
        stop_two.set()
        await watching  # its row is deleted as it stops
        async with pool.acquire() as conn:
            await one.refresh(conn)
        assert (one.members, one.share) == (1, Limit(10.0, 10))
    finally:
        stop_two.set()
        await pool.close()


async def test_invalid_overrides_are_refused_and_change_nothing(
    env: Env,
    nc: NATS,
    handler: ScriptedHandler,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await throttled_world(env, nc, handler, rate="5/s")
    for key, value in env.settings_env().items():
        if key.startswith("FERRY_"):
            monkeypatch.setenv(key, value)

    def ferry_here(*args: str) -> tuple[int, str]:
        try:
            code = cli.main(["durable", "throttle", *args])
        except SystemExit as exc:  # argparse refuses before the command runs
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    for args, says in (
        (["--rate", "5"], "needs a unit: write 5/s"),
        (["--rate", "5/x"], "unknown unit"),
        (["--rate", "0/s"], "below the slowest"),
        (["--rate", "5/s", "--burst", "0"], "between 1 and"),
        (["--rate", "5/s", "--clear"], "not allowed with argument"),
        (["--rate", "5/s"], "--reason is required"),
        (["--burst", "4", "--reason", "x"], "--burst goes with a --rate"),
    ):
        code, err = await asyncio.to_thread(ferry_here, "--durable", DURABLE, *args)
        assert (code, says in err) == (2, True), (args, err)
    code, err = await asyncio.to_thread(ferry_here, "--durable", "nope", "--clear", "--reason", "x")
    assert code == 2 and "no durable 'nope'" in err
    shown = await asyncio.to_thread(
        ferry, env, "--json", "durable", "throttle", "--durable", DURABLE
    )
    assert '"source": "topology"' in shown.stdout and '"actions": []' in shown.stdout
    # A critical lane is never throttled; lifting a limit (--rate none) is an override too.
    env.doc["durables"]["vibespro__from_sea"]["criticality"] = "high"
    env.write()
    code, err = await asyncio.to_thread(
        ferry_here, "--durable", "vibespro__from_sea", "--rate", "5/s", "--reason", "x"
    )
    assert code == 1 and "criticality: high and is never throttled" in err
    code, err = await asyncio.to_thread(
        ferry_here, "--durable", DURABLE, "--rate", "none", "--reason", "drain it"
    )
    assert code == 0, err
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        row = await conn.fetchrow("SELECT rate, burst FROM throttle_overrides")
        actions = await conn.fetch("SELECT action, actor, reason FROM throttle_actions")
    finally:
        await conn.close()
    assert row is not None and (row["rate"], row["burst"]) == (None, None)
    assert [(a["action"], a["reason"]) for a in actions] == [("set", "drain it")]
    assert actions[0]["actor"]  # who: OS user@host by default


async def _watch(consumer: ConsumerLoop, stop: asyncio.Event) -> None:
    await consumer.throttle.watch(consumer.holder.pool, stop, interval=0.2)


async def _some(handler: ScriptedHandler, ids: list[str]) -> bool:
    return applied(handler, ids) > 0


async def _all(handler: ScriptedHandler, ids: list[str]) -> bool:
    return applied(handler, ids) == len(ids)


async def _source(consumer: ConsumerLoop, source: str) -> bool:
    return consumer.throttle.source == source
