"""``ferry where``: the journey of a processed, a dead-lettered, a replayed and an
unpublished event, read back from the real tables and streams they went through."""

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

from shared.adapters import dead_letters
from shared.adapters.producer import record_event
from shared.ops.where import journey, render
from shared.runtime.settings import CommonSettings
from tests.conftest import ROOT, Env, admin_settings
from tests.consumer.conftest import DURABLE, STREAM, RunningConsumer
from tests.helpers import RunningPublisher, eventually

from .conftest import handler_app

pytestmark = pytest.mark.integration


async def _record(env: Env, faults: dict[str, Any] | None = None) -> tuple[str, str]:
    payload: dict[str, Any] = {"vibe_id": f"v-{uuid.uuid4().hex[:6]}", "title": "t"}
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
        [sys.executable, "-m", "shared.ops.cli", *args],
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
    assert f"stream   {STREAM} #" in done.stdout and "replayed" in done.stdout
    done = _ferry(env, "where", str(uuid.uuid4()), "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["found"] is False
    done = _ferry(env, "where", "not-a-uuid")
    assert done.returncode == 2 and "is not a message id" in done.stderr
