"""Signed handler calls end to end: real handler and consumer processes, real servers.

The example handler refuses unsigned, forged and stale requests with 401; a consumer
with the right secret gets its messages processed; a consumer with the wrong secret gets
401s, which it treats as a configuration error — it holds the message (no nak, no dead
letter) and alerts — until the handler is restarted with the secret, then it goes through.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from shared.access.streams import provision
from shared.domain.signing import sign
from tests.conftest import CAPS, ROOT, Env
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    publish,
)
from tests.handlers.conftest import make_doc
from tests.helpers import eventually

pytestmark = pytest.mark.integration

SECRET = "correct horse battery staple"


def spawn(env: Env, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
    """A role process with its own NATS user and database login (not the admin's)."""
    command = [sys.executable, "-m", *args]
    with open(env.tmp_path / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env.settings_env(command=command, **extra),
            stdout=log,
            stderr=log,
        )


async def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()


def secrets_file(env: Env, secret: str) -> Path:
    path = env.tmp_path / f"handler-secrets-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({DURABLE: secret}))
    path.chmod(0o600)
    return path


async def ready(port: int) -> None:
    async def check() -> bool:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/readyz") as resp,
            ):
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(check, timeout=30, what=f"handler on {port}")


def body_for() -> bytes:
    doc = make_doc("vibe_created", 1, {"vibe_id": "v1", "title": "t"}, durable=DURABLE)
    return json.dumps(doc).encode()


async def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/handle",
            data=body,
            headers={"Content-Type": "application/json", **headers},
        ) as resp,
    ):
        return resp.status, await resp.text()


async def test_the_handler_refuses_unsigned_forged_and_stale_requests(env: Env) -> None:
    port = free_port()
    proc = spawn(
        env, "handler", ["services.handlers", "--service", "sea", "--port", str(port)],
        FERRY_HANDLER_SECRETS_FILE=str(secrets_file(env, SECRET)),
    )  # fmt: skip
    try:
        await ready(port)
        body = body_for()
        key = {"Idempotency-Key": json.loads(body)["message_id"]}
        good = {**key, **sign(SECRET.encode(), DURABLE, body, time.time())}
        cases = {
            "unsigned": {},
            "forged": sign(b"guessed", DURABLE, body, time.time()),
            "stale": sign(SECRET.encode(), DURABLE, body, time.time() - 3600),
            "other durable": sign(SECRET.encode(), "vibespro__from_sea", body, time.time()),
        }
        for name, headers in cases.items():
            status, text = await post(port, body, headers)
            assert status == 401, (name, text)
            assert SECRET not in text
        result = await post(port, body, good)
        assert result[0] == 200, result[1]
        # The same signed request again, inside the window: the handler's idempotency.
        assert (await post(port, body, good))[0] == 409
    finally:
        await stop(proc)
    assert SECRET not in (env.tmp_path / "handler.log").read_text()


async def _status(env: Env, message_id: str) -> str | None:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        value = await conn.fetchval(
            "SELECT status FROM inbox_messages WHERE durable = $1 AND message_id = $2",
            DURABLE,
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()
    return None if value is None else str(value)


async def test_a_wrong_secret_holds_the_message_until_the_handler_is_fixed(
    env: Env, nc: NATS
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/handle"
    # A ladder that outlasts the handler's restart below (its gap is a normal retry).
    fast_durable(env, url, max_deliver=20, backoff=["1s"] * 5)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    handler = spawn(
        env, "handler", ["services.handlers", "--service", "sea", "--port", str(port)],
        FERRY_HANDLER_SECRETS_FILE=str(secrets_file(env, "the handler's other secret")),
    )  # fmt: skip
    consumer = spawn(
        env, "consumer", ["services.inbox_consumer", "--durable", DURABLE],
        FERRY_HANDLER_URL=url, FERRY_HANDLER_SECRET=SECRET, FERRY_FETCH_TIMEOUT="0.2",
        FERRY_AUTH_RETRY_INITIAL="0.2", FERRY_AUTH_RETRY_MAX="0.5",
    )  # fmt: skip
    try:
        await ready(port)
        event = envelope()
        await publish(nc, event)
        log = env.tmp_path / "consumer.log"
        await eventually(
            lambda: _true(log.read_text().count("handler refused our credentials") >= 3),
            timeout=30,
            what="the consumer alerting on 401s",
        )
        # Held: not processed, not dead-lettered, and not redelivered (still delivery 1).
        assert await _status(env, event.message_id) == "processing"
        info = await nc.jetstream().consumer_info("VIBESPRO_EVENTS", DURABLE)
        assert info.num_redelivered == 0 and info.num_ack_pending == 1
        await stop(handler)  # the operator fixes the handler's secret
        handler = spawn(
            env, "handler2", ["services.handlers", "--service", "sea", "--port", str(port)],
            FERRY_HANDLER_SECRETS_FILE=str(secrets_file(env, SECRET)),
        )  # fmt: skip
        await eventually(
            lambda: _is(env, event.message_id, "processed"), timeout=30, what="processed"
        )
    finally:
        await stop(consumer)
        await stop(handler)
    text = log.read_text()
    assert SECRET not in text and "dead-lettered" not in text


async def test_a_right_secret_is_processed_first_time(env: Env, nc: NATS) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/handle"
    fast_durable(env, url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    handler = spawn(
        env, "handler", ["services.handlers", "--service", "sea", "--port", str(port)],
        FERRY_HANDLER_SECRETS_FILE=str(secrets_file(env, SECRET)),
    )  # fmt: skip
    consumer = spawn(
        env, "consumer", ["services.inbox_consumer", "--durable", DURABLE],
        FERRY_HANDLER_URL=url, FERRY_HANDLER_SECRET=SECRET, FERRY_FETCH_TIMEOUT="0.2",
    )  # fmt: skip
    try:
        await ready(port)
        events = [envelope() for _ in range(10)]
        await asyncio.gather(*(publish(nc, e) for e in events))
        for event in events:
            await eventually(
                lambda e=event: _is(env, e.message_id, "processed"), timeout=30, what="processed"
            )
    finally:
        await stop(consumer)
        await stop(handler)
    assert "handler refused" not in (env.tmp_path / "consumer.log").read_text()


async def test_an_oversized_message_is_dead_lettered_not_parsed(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope(note="x" * 5000)
    async with RunningConsumer(world, nc, handler.url) as consumer:
        consumer.max_message_bytes = 2048
        await publish(nc, event)
        await eventually(lambda: _is(world, event.message_id, "failed"), timeout=30, what="dl")
    assert handler.calls == []
    conn = await asyncpg.connect(world.dsn("sea"))
    try:
        record = json.loads(
            await conn.fetchval(
                "SELECT record FROM dead_letters WHERE message_id = $1",
                uuid.UUID(event.message_id),
            )
        )
    finally:
        await conn.close()
    assert record["reasonCode"] == "MESSAGE_TOO_LARGE"
    assert record["status"] == "held"  # the same bytes can never pass


async def _is(env: Env, message_id: str, status: str) -> bool:
    return await _status(env, message_id) == status


async def _true(value: bool) -> bool:
    return value


async def test_refusals_hold_the_delivery_then_normal_rules_resume(
    world: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    event = envelope()
    handler.scripts[event.message_id] = [401, 403, 401, 503, 200]
    async with RunningConsumer(world, nc, handler.url) as consumer:
        consumer.decider.auth_retry = (0.1, 0.2)
        await publish(nc, event)
        await eventually(lambda: _is(world, event.message_id, "processed"), timeout=30, what="p")
    attempts = [c["body"]["delivery"]["attempt"] for c in handler.calls]
    # Three refusals on the first delivery (held, not redelivered), then the 503 naks it
    # like any retry, and the redelivery succeeds.
    assert attempts == [1, 1, 1, 1, 2]
    assert consumer.stats.auth_refusals == 3 and consumer.stats.alerts >= 3
