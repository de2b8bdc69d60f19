"""The throttle in the inbox-consumer role process (``python -m services.inbox_consumer``):
its limit on ``/metrics``, an operator's override (``ferry durable throttle``) applied by
the running process within its poll interval, and cleared again — no restart.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from shared.access.streams import provision
from tests.conftest import CAPS, Env, ferry
from tests.consumer.conftest import DURABLE, ScriptedHandler, envelope, fast_durable, publish
from tests.helpers import eventually
from tests.observability.conftest import Roles, get, metric_value, samples, wait_ready
from tests.observability.test_metrics import fetchval

pytestmark = pytest.mark.integration


async def test_the_role_exports_its_limit_and_applies_an_override_live(
    env: Env, nc: NATS, handler: ScriptedHandler, roles: Roles
) -> None:
    fast_durable(env, handler.url, throttle={"rate": "5/s", "burst": 5})
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    port = free_port()
    proc = roles.start(
        "consumer",
        ["services.inbox_consumer", "--durable", DURABLE],
        FERRY_HEALTH_PORT=str(port),
        FERRY_THROTTLE_POLL_INTERVAL="0.2",
        FERRY_METRICS_REFRESH_INTERVAL="0",
        FERRY_FETCH_TIMEOUT="0.2",
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        await wait_ready(session, port, proc, "consumer")

        async def limit() -> tuple[str, float] | None:
            status, text = await get(session, f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            found = [s for s in samples(text, "ferry_throttle_rate")
                     if s.labels["durable"] == DURABLE]  # fmt: skip
            return (found[0].labels["source"], found[0].value) if found else None

        async def shows(expected: tuple[str, float]) -> bool:
            return await limit() == expected

        assert await limit() == ("topology", 5.0)
        done = await asyncio.to_thread(
            ferry, env, "durable", "throttle", "--durable", DURABLE, "--rate", "600/m",
            "--reason", "catch up",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        await eventually(lambda: shows(("override", 10.0)), timeout=15, what="the override")
        ids = []
        for n in range(20):
            event = envelope(vibe_id=f"v{n}")
            await publish(nc, event)
            ids.append(event.message_id)

        async def processed() -> bool:
            return all(handler.applied[mid] == 1 for mid in ids)

        await eventually(processed, timeout=60, what="20 processed at 600/m")
        _, text = await get(session, f"http://127.0.0.1:{port}/metrics")
        assert metric_value(text, "ferry_throttle_wait_seconds_total", durable=DURABLE) > 0
        assert metric_value(text, "ferry_throttle_burst", durable=DURABLE) == 10

        done = await asyncio.to_thread(
            ferry, env, "durable", "throttle", "--durable", DURABLE, "--clear", "--reason", "day"
        )
        assert done.returncode == 0, done.stderr
        await eventually(lambda: shows(("topology", 5.0)), timeout=15, what="the topology's back")
        assert proc.poll() is None, "the consumer restarted or died"
    members = "SELECT count(*) FROM throttle_members WHERE durable = $1"
    assert await fetchval(env.dsn("sea"), members, DURABLE) == 1
    assert await roles.stop("consumer") == 0
    assert await fetchval(env.dsn("sea"), members, DURABLE) == 0  # it left as it stopped
