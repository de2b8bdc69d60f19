"""The outbox-publisher on partitioned streams, against real servers (the mediation topology:
H's stream has 2 partitions keyed by the payload's config_id, F's has 4 keyed by the
aggregate): every event lands on its key's partition subject, each key's events are in the
stream in commit order, each partition consumer gets exactly its keys, and a row whose key
field is missing is set aside (ORDERING_KEY_MISSING) without holding anything else back.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from services.outbox_publisher.failures import ORDERING_KEY_MISSING
from shared.access.streams import provision
from shared.adapters.postgres import migrate_database
from shared.adapters.producer import record_event
from shared.domain.ordering import partition_of, split_partition
from tests.conftest import CAPS, ROOT, Env
from tests.helpers import RunningPublisher, eventually, stream_messages

pytestmark = pytest.mark.integration

H_STREAM, F_STREAM = "MEDIATION_H_PUBLISH_JOBS", "MEDIATION_F_TO_G_ARCHIVE"
H_SUBJECT = "mediation.h.publish.jobs.config_publish_requested.v1"
F_SUBJECT = "mediation.f_to_g.archive.opportunity_archived.v1"


@pytest.fixture
async def mediation(tmp_path: Path, pg_server: PostgresServer, nats_server: NatsServer) -> Env:
    prefix = "t" + uuid.uuid4().hex[:10]
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    world = Env(tmp_path, pg_server, nats_server.url, doc)
    for database in world.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    return world


async def _published(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL")
    )


async def test_events_land_on_their_keys_partition_in_commit_order(
    mediation: Env, nc: NATS
) -> None:
    js = nc.jetstream()
    await provision(js, mediation.topology, caps=CAPS)
    conn = await asyncpg.connect(mediation.dsn("module_h"))
    try:
        committed: dict[str, list[int]] = defaultdict(list)
        # The key is the payload's config_id (manifests/mediation/module_h.yaml).
        for revision in range(1, 7):
            for n in range(12):
                config = f"cfg-{n}"
                async with conn.transaction():
                    await record_event(
                        conn,
                        aggregate_type="config",
                        aggregate_id=config,
                        event_type="config_publish_requested",
                        payload={"config_id": config, "revision": revision},
                    )
                committed[config].append(revision)
        # Written with plain SQL, without the key field: it cannot be partitioned.
        bad = uuid.uuid4()
        await conn.execute(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
            " event_version, payload) VALUES ($1, 'config', 'cfg-x', "
            "'config_publish_requested', 1, $2::jsonb)",
            bad,
            json.dumps({"revision": 1}),
        )
        async with RunningPublisher(mediation.topology, "module_h", mediation.dsn("module_h"), js):
            await eventually(lambda: _true_when(conn, 72), timeout=30, what="72 rows published")
            await eventually(
                lambda: _set_aside(conn, bad), timeout=10, what="the keyless row set aside"
            )
        row = await conn.fetchrow(
            "SELECT set_aside_reason, publish_error FROM outbox_events WHERE id = $1", bad
        )
        assert row["set_aside_reason"] == ORDERING_KEY_MISSING
        assert "config_id" in row["publish_error"]
    finally:
        await conn.close()

    messages = await stream_messages(js, H_STREAM)
    assert len(messages) == 72
    seen: dict[str, list[int]] = defaultdict(list)
    for msg in messages:
        config = msg.body["payload"]["config_id"]
        assert msg.subject == f"{H_SUBJECT}.{partition_of(config, 2)}"
        assert msg.body["subject"] == H_SUBJECT  # the envelope keeps the logical subject
        assert split_partition(msg.subject) == (H_SUBJECT, partition_of(config, 2))
        assert msg.headers["Ferry-Ordering-Key"] == config
        seen[config].append(msg.body["payload"]["revision"])
    assert seen == committed
    # Each partition consumer holds exactly its keys' messages.
    for k in range(2):
        info = await js.consumer_info(H_STREAM, f"cg_h_publish_p{k}")
        expected = sum(len(v) for c, v in committed.items() if partition_of(c, 2) == k)
        assert info.num_pending == expected
    assert {partition_of(c, 2) for c in committed} == {0, 1}


async def test_aggregate_keyed_events_partition_by_aggregate(mediation: Env, nc: NATS) -> None:
    js = nc.jetstream()
    await provision(js, mediation.topology, caps=CAPS)
    conn = await asyncpg.connect(mediation.dsn("module_f"))
    try:
        for n in range(20):
            async with conn.transaction():
                await record_event(
                    conn,
                    aggregate_type="opportunity",
                    aggregate_id=f"o-{n}",
                    event_type="opportunity_archived",
                    payload={"opportunity_key": f"o-{n}"},
                )
        async with RunningPublisher(mediation.topology, "module_f", mediation.dsn("module_f"), js):
            await eventually(lambda: _true_when(conn, 20), timeout=30, what="20 published")
    finally:
        await conn.close()
    messages = await stream_messages(js, F_STREAM)
    partitions = set()
    for msg in messages:
        key = f"opportunity/{msg.body['aggregate_id']}"
        assert msg.subject == f"{F_SUBJECT}.{partition_of(key, 4)}"
        assert msg.headers["Ferry-Ordering-Key"] == key
        partitions.add(partition_of(key, 4))
    assert partitions == {0, 1, 2, 3}
    # A partition's consumer delivers its messages in stream order, nothing of another.
    for k in range(4):
        sub = await js.pull_subscribe_bind(f"cg_g_archive_p{k}", stream=F_STREAM)
        got = await sub.fetch(20, timeout=2)
        assert [m.metadata.sequence.stream for m in got] == sorted(
            m.seq for m in messages if m.subject.endswith(f".{k}")
        )
        await sub.unsubscribe()


async def _true_when(conn: asyncpg.Connection, count: int) -> bool:
    return await _published(conn) >= count


async def _set_aside(conn: asyncpg.Connection, event_id: uuid.UUID) -> bool:
    value = await conn.fetchval("SELECT set_aside_at FROM outbox_events WHERE id = $1", event_id)
    return value is not None
