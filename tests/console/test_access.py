"""The console's own logins on real servers: it reads what an operator looks at, writes only
what ``ferry dlq``/``ferry parked`` write, publishes only replays, and can neither create a
named consumer nor change a stream."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy

from devstack.nats import NatsServer
from shared.access.identities import Identity
from shared.domain.subjects import replay_subject
from tests.access.test_nats_permissions import connected, streams
from tests.conftest import Env
from tests.helpers import stream_count

pytestmark = pytest.mark.integration
CONSOLE = "console-sea-vibespro"
__all__ = ["streams"]


async def test_console_nats_user_reads_info_and_publishes_replays_only(
    streams: Env, nats_server: NatsServer, nc: NATS
) -> None:
    admin = nc.jetstream()
    await admin.publish("vibespro.event.vibe_created.v1", b"{}")
    async with connected(nats_server, CONSOLE) as console:
        info = await console.js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
        assert info.num_pending == 1
        assert (await console.js.stream_info("SEA_DLQ")).config.name == "SEA_DLQ"
        assert (await console.js.get_msg("VIBESPRO_EVENTS", 1)).data == b"{}"
        # `ferry where`'s scan: an ephemeral ordered consumer reads the stream.
        sub = await console.js.subscribe(
            "vibespro.event.>",
            stream="VIBESPRO_EVENTS",
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, headers_only=True),
        )
        assert (await sub.next_msg(timeout=5)).subject == "vibespro.event.vibe_created.v1"
        await sub.unsubscribe()
        replay = replay_subject("VIBESPRO_EVENTS", "sea__from_vibespro")
        assert (await console.js.publish(replay, b"{}", timeout=2)).stream == "VIBESPRO_EVENTS"
        # Never an event of a context, a named consumer, a change to a stream.
        event = "sea.event.vibe_created.v1"
        await console.refused(lambda: console.js.publish(event, b"{}", timeout=1), event)
        await console.refused(
            lambda: console.js.add_consumer(
                "VIBESPRO_EVENTS", ConsumerConfig(durable_name="rogue", name="rogue")
            ),
            "$JS.API.CONSUMER.CREATE.VIBESPRO_EVENTS.rogue",
        )
        await console.refused(
            lambda: console.js.delete_consumer("VIBESPRO_EVENTS", "sea__from_vibespro"),
            "$JS.API.CONSUMER.DELETE.VIBESPRO_EVENTS.sea__from_vibespro",
        )
        await console.refused(
            lambda: console.js.purge_stream("VIBESPRO_EVENTS"),
            "$JS.API.STREAM.PURGE.VIBESPRO_EVENTS",
        )
    assert await stream_count(admin, "VIBESPRO_EVENTS") == 2  # the event and the replay
    assert (await admin.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")).name


async def test_console_database_login_reads_and_writes_only_what_the_cli_writes(
    env: Env,
) -> None:
    topology = env.topology
    identity = Identity("console", topology.name)
    conn = await asyncpg.connect(env.role_dsn(identity, topology.contexts["sea"].database))
    try:
        for table in ("outbox_events", "inbox_messages", "dead_letters", "dead_letter_actions",
                      "dead_letter_edits", "kpi_runs", "kpi_windows"):  # fmt: skip
            await conn.fetchval(f"SELECT count(*) FROM {table}")
        await conn.execute(  # what a replay and a park change
            "UPDATE dead_letters SET status = status WHERE durable = 'sea__from_vibespro'"
        )
        await conn.execute("UPDATE inbox_messages SET status = status")
        await conn.execute(
            "INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason) "
            "VALUES ('sea__from_vibespro', $1, 'park', 'ops@console', 'test')",
            uuid.uuid4(),
        )
        edit = (  # what an edit-and-retry records (both versions)
            "INSERT INTO dead_letter_edits (durable, message_id, replay_attempt, "
            "original_payload, edited_payload, changed, actor, reason) "
            "VALUES ($1, $2, 1, '{}', '{\"a\": 1}', ARRAY['payload.a'], 'ops@console', 'test')"
        )
        await conn.execute(edit, "sea__from_vibespro", uuid.uuid4())
        for statement in (
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, "
            "event_version, payload) VALUES (gen_random_uuid(), 'a', 'b', 'c', 1, '{}')",
            "UPDATE outbox_events SET published_at = now()",
            "DELETE FROM dead_letters",
            "DELETE FROM inbox_messages",
            "DELETE FROM dead_letter_actions",
            "DELETE FROM dead_letter_edits",
            "UPDATE dead_letter_edits SET reason = 'rewritten'",
            "INSERT INTO kpi_runs (run_id) VALUES (gen_random_uuid())",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
        # Rows of another topology's durables are invisible (row-level security).
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(
                "INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason) "
                "VALUES ('cg_f_ingest', $1, 'park', 'ops@console', 'test')",
                uuid.uuid4(),
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(edit, "cg_f_ingest", uuid.uuid4())
    finally:
        await conn.close()


def test_console_may_look_for_an_event_in_every_database_of_its_topology() -> None:
    """`ferry where` reads inbox rows and dead letters in every database: the console may,
    even where no durable lives (mediation_e), seeing no row there and writing nothing."""
    from shared.access.db_roles import describe
    from shared.contracts.loading import load_topology
    from tests.conftest import ROOT

    for name in ("sea-vibespro", "mediation"):
        topology = load_topology(ROOT / f"topologies/{name}.yaml")
        grants: dict[object, Any] = {
            d["database"]: d["tables"]
            for d in describe([topology])
            if d["role"] == f"ferry_console_{name.replace('-', '_')}"
        }
        assert set(grants) == set(topology.databases())
        for database, tables in grants.items():
            for table in ("outbox_events", "inbox_messages", "dead_letters", "kpi_runs"):
                assert "SELECT" in tables[table]["privileges"], (database, table)
            if not tables["inbox_messages"]["rows"]:
                assert tables["inbox_messages"]["privileges"] == ["SELECT"], database
                assert "parked_messages" not in tables
