"""A late MSG_TERMINATED advisory is not a failed replay (issue 22).

The interleaving, scripted on real servers: the consumer dead-letters a 422 directly and
terminates the message; its MSG_TERMINATED advisory waits in the advisory stream (no
router yet). A replay starts — marked ``replaying``, its publish not yet confirmed (here:
the stream cannot take it). Only then does the router read the advisory for the original
sequence. It used to take it for a failure of the replay: a second record, a replay
attempt spent, and the replay itself acked as a duplicate, never processed.
"""

from __future__ import annotations

import json
import uuid

import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import NoStreamResponseError

from shared.adapters import dead_letters
from tests.conftest import Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    inbox_row,
    publish,
)
from tests.dlq.support import (
    Roles,
    dead_letter_rows,
    raw_records,
    status_of,
    subjects_removed,
    true,
)
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def _status_is(env: Env, message_id: str, status: str) -> bool:
    return await status_of(env, message_id) == status


async def test_a_terminated_advisory_arriving_after_the_replay_started_records_nothing(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [422]  # then 200: the replay succeeds
    js = nc.jetstream()
    async with RunningConsumer(world, nc, handler.url), Roles(world, js) as roles:
        await publish(nc, event)
        await eventually(
            lambda: _status_is(world, event.message_id, "dead"), timeout=30, what="dead"
        )
        # The replay begins; its publish does not get through (the stream cannot take it).
        pool = roles.pools[world.topology.contexts["sea"].database]
        async with (
            subjects_removed(js, "VIBESPRO_EVENTS", "ferry.replay."),
            pool.acquire() as conn,
        ):
            with pytest.raises(NoStreamResponseError):
                await dead_letters.replay(
                    conn,
                    js,
                    durable=DURABLE,
                    message_id=uuid.UUID(event.message_id),
                    actor="test",
                    reason="replay under test",
                    automatic=False,
                    topology=world.topology,
                )
        assert await status_of(world, event.message_id) == "replaying"
        # Now the advisory for the original delivery reaches the router.
        router = roles.router()
        await eventually(lambda: true(router.stats.already == 1), timeout=30, what="advisory read")
        assert router.stats.recorded == 0
        # The replay's publish goes through (the replayer republishes it) and is processed.
        roles.replayer(unconfirmed_after=0.2)
        await eventually(
            lambda: _status_is(world, event.message_id, "replayed"), timeout=30, what="replayed"
        )
        assert roles.alive()
    assert handler.applied[event.message_id] == 1
    assert len(handler.calls) == 2
    [row] = await dead_letter_rows(world)
    assert row["generation"] == 1 and row["replay_attempts"] == 1
    assert len(await raw_records(js)) == 1
    inbox = await inbox_row(world, event.message_id)
    assert inbox is not None and inbox["status"] == "processed" and inbox["duplicates"] == 0
    assert json.loads(inbox["dlq_metadata"])["replay_attempts"] == 1
