"""Mediation end to end (INFRA-005): the E→F→G lanes through real role processes.

Module E records ``opportunity_scored`` in its outbox; its publisher sends it to lane
E→F; ``cg_f_ingest`` delivers it to module F's handler, which records
``opportunity_archived`` in F's outbox in the same transaction; F's publisher sends it to
lane F→G; ``cg_g_archive`` delivers it to G's handler — here a scripted one that keeps
every request body, so the INFRA-005 §2 envelope fields are checked as G receives them.
A message whose payload does not match its payloadDigest is dead-lettered onto the
unified ``mediation.dead_letter`` and held for an operator (§4.3).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from devstack.ports import free_port
from devstack.postgres import PostgresServer
from shared.access.streams import provision
from shared.adapters.postgres import migrate_database
from shared.adapters.producer import record_event
from shared.domain.envelope import payload_digest
from tests.conftest import CAPS, ROOT, Env
from tests.consumer.conftest import ScriptedHandler
from tests.helpers import eventually, stream_messages

pytestmark = pytest.mark.integration

EVENTS = 20


@pytest.fixture
async def mediation(
    tmp_path: Path, pg_server: PostgresServer, nats_server: NatsServer, nc: NATS
) -> AsyncIterator[Env]:
    doc = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    prefix = "m" + uuid.uuid4().hex[:10]
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    for durable in doc["durables"].values():  # test clocks: a retry in a second, not minutes
        durable.update(ack_wait="5s", backoff=["300ms", "300ms", "300ms", "300ms", "300ms"])
        durable["handler"]["timeout"] = "4s"
    # G's handler here is the per-message ScriptedHandler (it keeps each request body);
    # F's is the real module_f service, which answers the shipped batch calls.
    doc["durables"]["cg_g_archive"]["handler"]["batch"] = 1
    env = Env(tmp_path, pg_server, nats_server.url, doc)
    for database in env.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await env.grant_roles()
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    yield env


@contextmanager
def roles(env: Env, commands: list[tuple[str, list[str], dict[str, str]]]) -> Iterator[None]:
    procs = []
    try:
        for name, args, extra in commands:
            log = open(env.tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - closed below
            procs.append(
                (
                    subprocess.Popen(
                        argv := [sys.executable, "-m", *args],
                        cwd=ROOT,
                        env=env.settings_env(command=argv, **extra),
                        stdout=log,
                        stderr=log,
                    ),
                    log,
                )
            )
        yield
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


async def test_lanes_carry_infra005_fields_and_dead_letter_a_digest_mismatch(
    mediation: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    env = mediation
    f_port = free_port()
    f_url = f"http://127.0.0.1:{f_port}/handle"
    with roles(
        env,
        [
            ("pub-e", ["services.outbox_publisher", "--context", "module_e"], {}),
            ("pub-f", ["services.outbox_publisher", "--context", "module_f"], {}),
            ("handler-f", ["services.handlers", "--service", "module_f", "--port", str(f_port)],
             {}),
            ("con-f", ["services.inbox_consumer", "--durable", "cg_f_ingest"],
             {"FERRY_HANDLER_URL": f_url, "FERRY_FETCH_TIMEOUT": "0.2"}),
            ("con-g", ["services.inbox_consumer", "--durable", "cg_g_archive"],
             {"FERRY_HANDLER_URL": handler.url, "FERRY_FETCH_TIMEOUT": "0.2"}),
            ("router", ["services.dlq_router"], {"FERRY_FETCH_TIMEOUT": "0.2"}),
        ],
    ):  # fmt: skip
        keys = [f"opp-{i}" for i in range(EVENTS)]
        conn = await asyncpg.connect(env.dsn("module_e"))
        try:
            for key in keys:
                async with conn.transaction():
                    await record_event(
                        conn,
                        aggregate_type="opportunity",
                        aggregate_id=key,
                        event_type="opportunity_scored",
                        payload={"opportunity_key": key, "score": 0.5},
                    )
        finally:
            await conn.close()
        tampered = await _publish_tampered(nc)
        await eventually(
            lambda: _true(len(handler.applied) == EVENTS), timeout=90, what="G got every event"
        )
        await eventually(
            lambda: _held(env, tampered), timeout=30, what="the tampered message dead-lettered"
        )
    bodies = [c["body"] for c in handler.calls]
    assert sorted(b["payload"]["opportunity_key"] for b in bodies) == sorted(keys)
    for body in bodies:
        assert body["messageId"] == body["message_id"]
        assert body["module"] == "module_f" and body["eventType"] == "opportunity_archived"
        assert body["opportunityKey"] == body["payload"]["opportunity_key"]
        assert body["payloadDigest"] == payload_digest(body["payload"])
        assert body["retryCount"] == 0
        assert body["maxRetries"] == env.topology.durables["cg_g_archive"].max_deliver - 1
        assert body["traceKey"] == body["correlation_id"]  # F carried E's correlation
        assert body["createdAt"] == body["occurred_at"]
    # The unified dead-letter stream holds exactly the tampered one, with INFRA-005 §4.
    [record] = [m.body for m in await stream_messages(nc.jetstream(), "MEDIATION_DEAD_LETTER")]
    assert record["message_id"] == tampered and record["reasonCode"] == "DIGEST_MISMATCH"
    assert record["failedStream"] == "MEDIATION_E_TO_F_EVENTS"
    assert record["replay_policy"] == "operator" and record["status"] == "held"
    assert {"payload", "lastError", "retryHistory"} <= record.keys()


async def _publish_tampered(nc: NATS) -> str:
    message_id = str(uuid.uuid4())
    body = {
        "message_id": message_id,
        "subject": "mediation.e_to_f.events.opportunity_scored.v1",
        "context": "module_e",
        "event_type": "opportunity_scored",
        "event_version": 1,
        "occurred_at": "2026-11-21T10:00:00.000000Z",
        "aggregate_type": "opportunity",
        "aggregate_id": "opp-x",
        "payload": {"opportunity_key": "opp-x", "score": 0.9},
        # The digest of a different payload: altered in transit.
        "payload_digest": payload_digest({"opportunity_key": "opp-x", "score": 0.1}),
    }
    await nc.jetstream().publish(
        body["subject"], json.dumps(body).encode(), headers={"Nats-Msg-Id": message_id}
    )
    return message_id


async def _held(env: Env, message_id: str) -> bool:
    conn = await asyncpg.connect(env.dsn("module_f"))
    try:
        status = await conn.fetchval(
            "SELECT status FROM dead_letters WHERE durable = 'cg_f_ingest' AND message_id = $1",
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()
    return bool(status == "held")


async def _true(value: bool) -> bool:
    return value
