"""Readiness: NATS and PostgreSQL connected and, for consumers, bound to the durable."""

from __future__ import annotations

import json

import aiohttp
import asyncpg
import nats
import pytest

from devstack.nats import NatsServer
from devstack.ports import free_port
from shared.access.streams import provision
from shared.runtime.health import HealthServer
from shared.runtime.readiness import postgres_probe
from tests.conftest import CAPS, Env, admin_auth
from tests.consumer.conftest import DURABLE
from tests.helpers import eventually

from .conftest import Roles, get, wait_ready

pytestmark = pytest.mark.integration


async def test_readiness_drops_when_nats_goes_away_and_returns_with_it(
    env: Env, nats_server: NatsServer, roles: Roles
) -> None:
    options = admin_auth(nats_server).options([nats_server.url])
    client = await nats.connect(nats_server.url, **options)
    try:
        await provision(client.jetstream(), env.topology, caps=CAPS)
    finally:
        await client.close()
    port = free_port()
    proc = roles.start(
        "consumer", ["services.inbox_consumer", "--durable", DURABLE],
        FERRY_HEALTH_PORT=str(port), FERRY_NATS_PING_INTERVAL="0.5", FERRY_FETCH_TIMEOUT="0.2",
    )  # fmt: skip
    readyz, healthz = f"http://127.0.0.1:{port}/readyz", f"http://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        await wait_ready(session, port, proc, "consumer")
        _, body = await get(session, readyz)
        assert json.loads(body) == {"ready": True, "failing": [], "hops": {}}

        nats_server.stop()

        async def not_ready() -> bool:
            status, body = await get(session, readyz)
            doc = json.loads(body)
            # Which hop, and why (the client's last error: the refused connection).
            return status == 503 and doc["failing"] == ["nats"] and "nats" in doc["hops"]

        await eventually(not_ready, timeout=20, what="/readyz 503 naming nats and why")
        why = json.loads((await get(session, readyz))[1])["hops"]["nats"]["why"]
        assert any(w in why.lower() for w in ("eof", "refused", "connect")), why
        assert (await get(session, healthz))[0] == 200  # alive: no restart wanted
        assert proc.poll() is None

        nats_server.start()  # same port, same store: the durable is still there

        async def ready_again() -> bool:
            return (await get(session, readyz))[0] == 200

        await eventually(ready_again, timeout=30, what="/readyz 200 after NATS returned")
        assert json.loads((await get(session, readyz))[1])["hops"] == {}
        metrics = (await get(session, f"http://127.0.0.1:{port}/metrics"))[1]
        assert 'ferry_ready{check="nats"} 1.0' in metrics
        assert 'ferry_ready{check="durable"} 1.0' in metrics
    assert await roles.stop("consumer") == 0


async def test_readiness_names_postgresql_when_it_cannot_be_reached(env: Env) -> None:
    pool = await asyncpg.create_pool(env.dsn("sea"), min_size=1, max_size=1)
    port = free_port()
    health = HealthServer(
        host="127.0.0.1", port=port, checks={"nats": lambda: True, "postgres": postgres_probe(pool)}
    )
    await health.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            assert (await get(session, f"http://127.0.0.1:{port}/readyz"))[0] == 200
            await pool.close()  # as good as a server gone: no connection to be had
            status, body = await get(session, f"http://127.0.0.1:{port}/readyz")
            assert status == 503 and json.loads(body)["failing"] == ["postgres"]
    finally:
        await health.stop()
