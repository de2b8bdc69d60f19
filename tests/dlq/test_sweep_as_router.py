"""The sweep works with the dlq-router's own NATS user and PostgreSQL login (least privilege).

It reads each durable's consumer info and the dead-letter streams' info, locks inbox rows
FOR UPDATE and writes dead letters: every one of those must be granted to the router's
identities, or the sweep fails in production while passing as the admin.
"""

from __future__ import annotations

import json

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from services.dlq_router.router import ERRORS
from services.dlq_router.sweep import Sweep
from shared.access.identities import identity_named
from shared.access.streams import provision
from shared.adapters.dead_letters.records import LIMITS
from shared.domain.dead_letter import SWEEP_REASON
from tests.access.test_nats_permissions import connected
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    publish,
)
from tests.dlq.support import raw_records, true
from tests.helpers import eventually

pytestmark = pytest.mark.integration

ROUTER = "dlq-router-sea-vibespro"


async def test_the_sweep_runs_as_the_router_role(
    env: Env, nc: NATS, nats_server: NatsServer, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, ack_wait="1s", max_deliver=2, backoff=["100ms"])
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    event = envelope()
    handler.scripts[event.message_id] = [500, 500]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await publish(nc, event)
        await eventually(lambda: true(consumer.stats.exhausted == 1), timeout=30, what="exhausted")
    await nc.jetstream().purge_stream(env.topology.advisory_stream)  # the advisory is lost
    identity = identity_named([env.topology], ROUTER)
    pools = {
        c.database: await asyncpg.create_pool(
            env.role_dsn(identity, c.database), min_size=1, max_size=2
        )
        for c in env.topology.contexts.values()
    }
    try:
        async with connected(nats_server, ROUTER) as router:
            assert await LIMITS._stream_limit(router.js, "SEA_DLQ") is not None
            sweep = Sweep(
                topology=env.topology, pools=pools, js=router.js, margin=0.5, errors=ERRORS
            )

            async def swept() -> bool:
                return await sweep.run_once() == 1

            await eventually(swept, timeout=30, what="swept", interval=0.3)
            assert sweep.stats.errors == 0 and router.errors == []
    finally:
        for pool in pools.values():
            await pool.close()
    [data] = await raw_records(nc.jetstream())
    assert json.loads(data)["reasonCode"] == SWEEP_REASON
