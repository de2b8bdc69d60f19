"""A nak that cannot reach JetStream is retried until it takes effect (issue 44).

Against a real nats-server that is stopped while the consumer naks a message and started
again on its store: the nak is confirmed once the server is back, and the message comes
back after the nak's delay — not after its ack_wait (60 s here), which is what a nak
published into the void would cost. (A leader failover on the three-node cluster is the
same story: the chaos suite's cluster scenario measures it.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from devstack.nats import NatsServer
from services.inbox_consumer import puller as puller_module
from services.inbox_consumer.puller import Puller
from shared.adapters.jetstream_answers import Answers
from shared.adapters.nats import connect_nats

pytestmark = pytest.mark.integration

ACK_WAIT = 60.0


async def test_a_nak_sent_while_the_server_is_down_takes_effect_when_it_is_back(
    tmp_path: Path,
) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    nc = await connect_nats([server.url], name="test-answers", ping_interval=0.5)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        config = ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT)
        await js.add_consumer("T", config)
        await js.publish("t.a", b"x", headers={"Nats-Msg-Id": "one"})
        answers = Answers(confirm_within=30.0, remember_for=10.0)
        puller = Puller(js, stream="T", durable="d", window=1, answers=answers)
        await puller.start()
        batch = await puller.next_batch(1, timeout=10)
        await puller.stop()
        assert len(batch) == 1 and batch[0].metadata.num_delivered == 1

        server.stop()
        naking = asyncio.create_task(batch[0].nak(delay=0.5))
        await asyncio.sleep(1.5)  # the nak's first tries find no server
        assert not naking.done()
        server.start()
        await asyncio.wait_for(naking, timeout=40)
        assert answers.stats.confirmed_late == 1 and answers.stats.unconfirmed == 0

        # Back after the nak's half second: a fetch bounded well below ack_wait gets it.
        sub = await js.pull_subscribe_bind("d", "T")
        [again] = await sub.fetch(1, timeout=ACK_WAIT / 3)
        assert again.metadata.num_delivered == 2
        assert again.headers is not None and again.headers["Nats-Msg-Id"] == "one"
        await again.ack()
    finally:
        await nc.close()
        server.stop()


async def test_after_a_server_restart_the_puller_asks_again_at_once(tmp_path: Path) -> None:
    """A server SIGKILLed and started again has forgotten the pull requests; told of the
    reconnect, the puller asks again at once rather than after its silence limit (11 s):
    a message published then is handed over within one wait shorter than that limit."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    nc = await connect_nats([server.url], name="test-reconnect", ping_interval=0.5)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        config = ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
        await js.add_consumer("T", config)
        puller = Puller(js, stream="T", durable="d", window=5)
        await puller.start()
        assert await puller.next_batch(5, timeout=0.3) == []  # a request is waiting
        server.kill()  # SIGKILL: no "409 server shutdown" to the waiting request
        server.start()
        for _ in range(200):
            if nc.stats["reconnects"] >= 1 and nc.is_connected:
                break
            await asyncio.sleep(0.1)
        assert nc.stats["reconnects"] >= 1 and nc.is_connected
        await puller.reconnected()
        for attempt in range(20):  # JetStream takes a moment to load the stream again
            try:
                await js.publish("t.a", b"x", headers={"Nats-Msg-Id": "after"}, timeout=1)
                break
            except Exception:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
        batch = await puller.next_batch(5, timeout=puller_module.SILENCE_LIMIT / 2)
        assert [m.headers["Nats-Msg-Id"] for m in batch] == ["after"]  # type: ignore[index]
        await batch[0].ack()
        await puller.stop()
    finally:
        await nc.close()
        server.stop()
