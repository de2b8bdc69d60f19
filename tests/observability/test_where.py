"""``ferry where``: the journey of a processed, a dead-lettered, a replayed and an
unpublished event, read back from the real tables and streams they went through; and, for
an ``ordering: key`` durable on a partitioned stream, an event's key, partition and place
in its key's parked queue."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from services.inbox_consumer.__main__ import accepted_events, ordering_keys
from services.inbox_consumer.consumer import ConsumerLoop, build_consumer
from services.inbox_consumer.dispatch import HttpHandler
from shared.access.streams import provision
from shared.adapters import dead_letters, parking
from shared.adapters.producer import record_event
from shared.domain.ack import RetryPolicy
from shared.domain.ordering import partition_of
from shared.ops.where import journey
from shared.ops.where_render import render
from shared.runtime.settings import CommonSettings
from tests.conftest import CAPS, ROOT, Env, admin_settings
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    fast_durable,
)
from tests.helpers import RunningPublisher, eventually, stream_messages

from .conftest import handler_app

pytestmark = pytest.mark.integration


async def _record(
    env: Env, faults: dict[str, Any] | None = None, *, vibe_id: str | None = None
) -> tuple[str, str]:
    payload: dict[str, Any] = {"vibe_id": vibe_id or f"v-{uuid.uuid4().hex[:6]}", "title": "t"}
    if faults:
        payload["_ferry_test"] = faults
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="vibe",
                aggregate_id=payload["vibe_id"],
                event_type="vibe_created",
                payload=payload,
                traceparent=traceparent,
                context="vibespro",
            )
    finally:
        await conn.close()
    return str(event_id), traceparent


async def _status(env: Env, message_id: str) -> str | None:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT status FROM inbox_messages WHERE durable = $1 AND message_id = $2",
            DURABLE,
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()


def _settings(env: Env) -> CommonSettings:
    databases = {c.database: env.pg.dsn(c.database) for c in env.topology.contexts.values()}
    return CommonSettings(
        topology=env.path,
        nats_url=env.nats_url,
        databases=databases,
        **admin_settings(env.nats_url),
        trace_url_template="http://jaeger:16686/trace/{trace_id}",
    )


def _ferry(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT, env=env.settings_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_where_follows_processed_dead_lettered_replayed_and_unpublished_events(
    sea_world: Env, nc: NATS
) -> None:
    env = sea_world
    later = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    async with handler_app(env, "sea", fault_injection=True) as app:
        env.doc["durables"][DURABLE]["handler"]["url"] = app.url
        env.write()
        processed, processed_tp = await _record(env)
        poison, _ = await _record(env, {"poison": True})
        fixed, _ = await _record(env, {"reject_until": later})
        async with (
            RunningPublisher(env.topology, "vibespro", env.dsn("vibespro"), nc.jetstream()),
            RunningConsumer(env, nc, app.url),
        ):

            async def settled() -> bool:
                return [await _status(env, m) for m in (processed, poison, fixed)] == [
                    "processed", "failed", "failed",
                ]  # fmt: skip

            await eventually(settled, timeout=30, what="three events settled")
            await asyncio.sleep(max(0.0, (datetime.fromisoformat(later) - datetime.now(UTC))
                                    .total_seconds()))  # fmt: skip
            conn = await asyncpg.connect(env.dsn("sea"))
            try:
                await dead_letters.replay(
                    conn, nc.jetstream(), durable=DURABLE, message_id=uuid.UUID(fixed),
                    actor="alice", reason="handler fixed", automatic=False,
                    topology=env.topology,
                )  # fmt: skip

                async def replayed() -> bool:
                    await dead_letters.settle_replayed(conn, [DURABLE])
                    row = await conn.fetchrow(
                        "SELECT status FROM dead_letters WHERE message_id = $1",
                        uuid.UUID(fixed),
                    )
                    return bool(row and row["status"] == "replayed")

                await eventually(replayed, timeout=30, what="the replay processed")
            finally:
                await conn.close()
        unpublished, _ = await _record(env)  # the publisher is gone

    settings = _settings(env)
    topology = env.topology

    doc = await journey(settings, topology, uuid.UUID(processed))
    [hop] = doc["durables"]
    assert hop["ordering"] is None  # an unordered durable: no key, no partition
    assert "ordering:" not in render(doc)
    assert doc["found"] and doc["outbox"]["context"] == "vibespro"
    assert doc["outbox"]["published_at"] is not None and doc["outbox"]["publish_attempts"] == 1
    assert doc["stream"]["stream"] == STREAM
    assert doc["stream"]["subject"] == "vibespro.event.vibe_created.v1"
    assert doc["stream"]["sequence"] == hop["inbox"]["stream_seq"]
    assert hop["durable"] == DURABLE and hop["inbox"]["status"] == "processed"
    assert hop["delivery"]["state"] == "acknowledged"
    assert [c["status"] for c in hop["handler_calls"]] == [200]
    assert hop["dead_letter"] is None
    assert doc["trace"]["trace_id"] == processed_tp.split("-")[1]
    assert doc["trace"]["url"] == f"http://jaeger:16686/trace/{processed_tp.split('-')[1]}"

    doc = await journey(settings, topology, uuid.UUID(poison))
    [hop] = doc["durables"]
    assert hop["inbox"]["status"] == "failed"
    assert hop["dead_letter"]["reason_code"] == "HANDLER_REJECTED"
    assert hop["dead_letter"]["status"] == "dead"  # automatic policy: a replay is due
    assert [c["status"] for c in hop["handler_calls"]] == [422]
    text = render(doc)
    assert "dead letter: dead (HANDLER_REJECTED" in text

    doc = await journey(settings, topology, uuid.UUID(fixed))
    [hop] = doc["durables"]
    assert hop["inbox"]["status"] == "processed"
    assert hop["dead_letter"]["status"] == "replayed"
    assert hop["dead_letter"]["replay_attempts"] == 1
    assert [(a["action"], a["actor"]) for a in hop["dead_letter"]["actions"]] == [
        ("replay", "alice")
    ]
    assert [c["status"] for c in hop["handler_calls"]] == [422, 200]

    doc = await journey(settings, topology, uuid.UUID(unpublished))
    assert doc["outbox"]["published_at"] is None and doc["stream"] is None
    assert doc["durables"][0]["inbox"] is None
    assert "NOT PUBLISHED yet" in render(doc)

    # The command itself, as an operator runs it.
    done = _ferry(env, "where", fixed)
    assert done.returncode == 0, done.stderr
    # Its own NATS connection, closed when done: no warning of a lost link.
    assert "nats disconnected" not in done.stderr, done.stderr
    assert f"stream   {STREAM} #" in done.stdout and "replayed" in done.stdout
    done = _ferry(env, "where", str(uuid.uuid4()), "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["found"] is False
    done = _ferry(env, "where", "not-a-uuid")
    assert done.returncode == 2 and "is not a message id" in done.stderr


MIRROR = "sea__mirror"


def _vibe_on(partition: int, partitions: int, avoid: str = "") -> str:
    """A vibe id whose key (``vibe/<id>``) falls on ``partition``."""
    for n in range(10_000):
        vibe = f"v-{partition}-{n}"
        if vibe != avoid and partition_of(f"vibe/{vibe}", partitions) == partition:
            return vibe
    raise AssertionError("no vibe id on that partition")


class PartitionConsumer:
    """The role's consumer class on one partition consumer of an ordered durable."""

    def __init__(self, env: Env, nc: NATS, url: str, partition: int) -> None:
        self.env, self.nc, self.url, self.partition = env, nc, url, partition
        self.stop = asyncio.Event()

    async def __aenter__(self) -> ConsumerLoop:
        topology = self.env.topology
        spec = topology.durable(DURABLE)
        plan = topology.consumers(DURABLE)[self.partition]
        self.pool = await asyncpg.create_pool(self.env.dsn("sea"), min_size=1, max_size=4)
        self.http = HttpHandler(self.url, timeout=spec.handler.timeout, connections=4)
        consumer = build_consumer(
            pool=self.pool,
            js=self.nc.jetstream(),
            durable=DURABLE,
            spec=spec,
            handler=self.http,
            owner=f"test-{uuid.uuid4().hex[:6]}",
            concurrency=4,
            lease_seconds=spec.handler.timeout + 2,
            policy=RetryPolicy(tuple(spec.backoff), spec.max_deliver, 5.0),
            accepted=accepted_events(topology, DURABLE),
            partition=self.partition,
            js_consumer=plan.name,
            key_fields=ordering_keys(topology, DURABLE),
        )
        self.task = asyncio.create_task(consumer.run(self.stop, fetch_timeout=0.2))
        return consumer

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=20)
        await self.http.close()
        await self.pool.close()


async def test_where_shows_an_ordered_events_key_partition_and_what_it_waits_behind(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    # VibesPro's stream in 4 partitions; SEA's durable ordered by key (the aggregate);
    # beside it an unordered durable reading one event on every partition ('.*').
    env.doc["contexts"]["vibespro"]["stream"]["partitions"] = 4
    fast_durable(env, handler.url, ordering="key", on_dead_letter="hold")
    env.doc["durables"][MIRROR] = {
        **env.doc["durables"][DURABLE],
        "filter_subjects": ["vibespro.event.vibe_created.v1.*"],
        "ordering": "none",
        "dead_letter_subject": f"sea.dlq.{MIRROR}",
    }
    env.write()
    js = nc.jetstream()
    await provision(js, env.topology, caps=CAPS)

    flowing = _vibe_on(1, 4)  # its partition's consumer runs: processed normally
    blocked = _vibe_on(3, 4)  # a key parked behind a held head (its consumer is not run)
    head, _ = await _record(env, vibe_id=blocked)
    waiting, _ = await _record(env, vibe_id=blocked)
    done, _ = await _record(env, vibe_id=flowing)
    last, _ = await _record(env, vibe_id=blocked)
    arriving, _ = await _record(env, vibe_id=blocked)  # not parked (yet): not delivered
    async with RunningPublisher(env.topology, "vibespro", env.dsn("vibespro"), js):

        async def published() -> bool:
            return len(await stream_messages(js, STREAM)) == 5

        await eventually(published, timeout=30, what="five events published")
    stored = {m.msg_id: m for m in await stream_messages(js, STREAM)}
    assert stored[done].subject == "vibespro.event.vibe_created.v1.1"
    assert stored[waiting].subject == "vibespro.event.vibe_created.v1.3"

    # The blocked key's queue, as the consumer would have parked it: a held head (dead-
    # lettered under on_dead_letter: hold) and two later events of its key behind it.
    key = f"vibe/{blocked}"

    def entry(mid: str, **state: Any) -> parking.ParkedEntry:
        msg = stored[mid]
        return parking.ParkedEntry(
            message_id=uuid.UUID(mid), ordering_key=key, stream_seq=msg.seq, partition=3,
            subject=msg.subject, headers=msg.headers, data=json.dumps(msg.body).encode(),
            **state,
        )  # fmt: skip

    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        await parking.park(
            conn,
            DURABLE,
            [
                entry(head, state="held", attempts=4, reason="HANDLER_REJECTED scripted 422"),
                entry(waiting),
                entry(last),
            ],
        )
    finally:
        await conn.close()

    async with PartitionConsumer(env, nc, handler.url, partition=1) as consumer:
        await eventually(
            lambda: _true(consumer.stats.processed == 1), timeout=30, what="one processed"
        )

    settings = _settings(env)
    topology = env.topology

    # Processed normally: its key and partition, nothing parked.
    doc = await journey(settings, topology, uuid.UUID(done))
    hops = {h["durable"]: h for h in doc["durables"]}
    assert set(hops) == {DURABLE, MIRROR}  # the '.*' filter takes it too
    hop = hops[DURABLE]
    assert hop["inbox"]["status"] == "processed"
    assert hop["ordering"] == {
        "key": f"vibe/{flowing}",
        "key_field": None,
        "key_from": "outbox",
        "key_error": None,
        "partitions": 4,
        "partition": 1,
        "consumer": f"{DURABLE}_p1",
        "on_dead_letter": "hold",
        "parked": None,
        "key_parked": None,
    }
    assert hop["delivery"]["consumer"] == f"{DURABLE}_p1"
    assert hop["delivery"]["state"] == "acknowledged"
    assert hop["place"] == {"place": "processed"}
    assert hops[MIRROR]["ordering"] is None
    assert hops[MIRROR]["delivery"]["consumer"] == MIRROR
    assert hops[MIRROR]["delivery"]["state"] == "pending (not delivered yet)"
    text = render(doc)
    assert f"ordering: key vibe/{flowing} (aggregate), partition 1 of 4" in text
    assert f"jetstream (consumer {DURABLE}_p1): acknowledged" in text
    assert "parked:" not in text

    # Parked behind the held head: one before it (the head), one after it.
    doc = await journey(settings, topology, uuid.UUID(waiting))
    hop = next(h for h in doc["durables"] if h["durable"] == DURABLE)
    ordering = hop["ordering"]
    assert (ordering["key"], ordering["partition"]) == (key, 3)
    assert hop["delivery"]["consumer"] == f"{DURABLE}_p3"
    assert hop["delivery"]["state"] == "pending (not delivered yet)"
    parked = ordering["parked"]
    assert (parked["state"], parked["attempts"]) == ("queued", 0)
    assert parked["next_attempt_at"] is not None
    assert (parked["before"], parked["after"], parked["is_head"]) == (1, 1, False)
    assert parked["head"]["message_id"] == head
    assert (parked["head"]["state"], parked["head"]["attempts"]) == ("held", 4)
    assert parked["head"]["reason"] == "HANDLER_REJECTED scripted 422"
    # Parked, never lost: named with the held head it waits behind.
    assert hop["place"] == {
        "place": "parked",
        "head": head,
        "behind_held_head": True,
        "parked_state": "queued",
    }
    text = render(doc)
    assert f"{DURABLE} (→ sea): PARKED behind the held head {head}" in text
    assert (
        f"waits behind 1 parked event(s) of its key (1 behind it); the head {head} is held x4"
        in text
    )
    assert f"ferry dlq replay {DURABLE} {head} --reason" in text
    assert f"ferry parked discard --durable {DURABLE} --key {key}" in text
    # Behind its head it has no time of its own (it waits at 'infinity', 0022).
    assert "parked: queued, 0 attempt(s), waits its turn behind the events before it" in text
    assert "9999" not in text

    # The head itself: held, two waiting behind it.
    doc = await journey(settings, topology, uuid.UUID(head))
    parked = next(h for h in doc["durables"] if h["durable"] == DURABLE)["ordering"]["parked"]
    assert (parked["state"], parked["is_head"], parked["head"]) == ("held", True, None)
    assert (parked["before"], parked["after"]) == (0, 2)
    assert "the head of its key: 2 parked event(s) wait behind it" in render(doc)
    assert "PARKED (the head of its key, held)" in render(doc)
    # Each event behind it remembers the held head (copied to its inbox row on release).
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        marks = await conn.fetch(
            "SELECT message_id::text AS id, held_head::text AS head FROM parked_messages"
            " WHERE durable = $1",
            DURABLE,
        )
    finally:
        await conn.close()
    assert {r["id"]: r["head"] for r in marks} == {head: None, waiting: head, last: head}

    # Not parked itself, but its key is: the key's head and how many are parked.
    doc = await journey(settings, topology, uuid.UUID(arriving))
    ordering = next(h for h in doc["durables"] if h["durable"] == DURABLE)["ordering"]
    assert ordering["parked"] is None
    assert ordering["key_parked"]["events"] == 3
    assert ordering["key_parked"]["head"]["message_id"] == head
    assert ordering["key_parked"]["head"]["state"] == "held"
    assert f"its key has 3 parked event(s) now, head {head} held x4" in render(doc)

    # The command, as an operator runs it.
    done_cli = _ferry(env, "where", last, "--json")
    assert done_cli.returncode == 0, done_cli.stderr
    hop = next(h for h in json.loads(done_cli.stdout)["durables"] if h["durable"] == DURABLE)
    assert hop["ordering"]["parked"]["before"] == 2
    assert hop["ordering"]["parked"]["after"] == 0
    assert hop["ordering"]["parked"]["head"]["message_id"] == head


async def _true(value: bool) -> bool:
    return value
