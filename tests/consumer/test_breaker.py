"""The circuit breaker against a real nats-server and PostgreSQL (issue 45).

The handler is down (every call answered 503) while events arrive, then comes back. With
``max_deliver`` 4 and a 200 ms back-off, every event would be spent and dead-lettered
within a second or two of the outage; with the breaker open, the consumer holds them
(heart-beating: no delivery counted) and probes, so the outage ends with every event
applied once, none dead-lettered, and no event past its second delivery — probes
included: a failed probe keeps its messages in hand for the next probe.
"""

from __future__ import annotations

from collections import Counter

import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    publish,
)
from tests.dlq.support import true
from tests.helpers import eventually

pytestmark = pytest.mark.integration

EVENTS = 12
BREAKER = {"failures": 3, "window": "10s", "probe_every": "500ms"}


async def test_an_outage_is_held_and_probed_not_spent(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, ack_wait="2s", circuit_breaker=BREAKER)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    handler.down = True
    events = [envelope() for _ in range(EVENTS)]
    async with RunningConsumer(env, nc, handler.url, concurrency=4) as consumer:
        breaker = consumer.decider.breaker
        for event in events:
            await publish(nc, event)
        await eventually(lambda: true(breaker.state != "closed"), timeout=30, what="breaker open")
        # Several probe intervals and ack_waits of outage: nothing may be spent meanwhile.
        await eventually(lambda: true(breaker.probes >= 6), timeout=30, what="six probes")
        assert consumer.stats.dead_lettered == 0 and consumer.stats.exhausted == 0
        handler.down = False
        await eventually(
            lambda: true(all(handler.applied[e.message_id] == 1 for e in events)),
            timeout=60,
            what="every event applied after the outage",
        )
        assert breaker.state == "closed" and breaker.opened >= 1
    assert consumer.stats.dead_lettered == 0 and consumer.stats.exhausted == 0
    failed = Counter(c["body"]["message_id"] for c in handler.calls if c["outcome"] == 503)
    # Before it opened, at most the calls in flight (concurrency 4) plus the three that
    # opened it failed; after, only probes: each failed call beyond the first per event is
    # a probe.
    probes_failed = sum(n - 1 for n in failed.values())
    assert probes_failed <= breaker.probes
    assert all(handler.applied[e.message_id] == 1 for e in events)
    attempts = Counter(c["body"]["message_id"] for c in handler.calls)
    assert max(attempts.values()) <= 2 + probes_failed
    # JetStream's own count: no event past its second delivery, probes included (a failed
    # probe keeps its message in hand for the next one, it is not nak'ed).
    deliveries = {c["body"]["delivery"]["attempt"] for c in handler.calls}
    assert max(deliveries) <= 2, sorted(deliveries)
    assert breaker.kept >= probes_failed
