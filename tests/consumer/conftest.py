"""A scripted handler service and an in-process consumer for the ACK-rule tests.

The scripted handler is the independent record: it logs every call it receives (no
deduplication) and applies each message id at most once (answering 409 after), so
tests count handler calls and applications against what was published.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from services.inbox_consumer.__main__ import accepted_events
from services.inbox_consumer.consumer import ConsumerLoop, build_consumer
from services.inbox_consumer.dispatch import HttpHandler
from shared.access.streams import provision
from shared.domain.ack import RetryPolicy
from shared.domain.envelope import Envelope
from tests.conftest import CAPS, Env
from tests.helpers import stream_messages

DURABLE = "sea__from_vibespro"
STREAM = "VIBESPRO_EVENTS"

Script = Callable[[dict[str, Any], int], Any]


@dataclass
class ScriptedHandler:
    """An aiohttp handler whose answers tests script per message id."""

    port: int = field(default_factory=free_port)
    calls: list[dict[str, Any]] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    scripts: dict[str, list[Any]] = field(default_factory=dict)
    delay: float = 0.0
    #: While True every call is answered 503 (the handler is down), scripts untouched.
    down: bool = False
    #: Calls in progress at once: at most, and at most for one aggregate (ordering tests).
    max_in_flight: int = 0
    max_in_flight_per_key: int = 0
    _in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/handle"

    def calls_for(self, message_id: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["body"]["message_id"] == message_id]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = str(body.get("aggregate_id"))
        self._in_flight[key] += 1
        self.max_in_flight_per_key = max(self.max_in_flight_per_key, self._in_flight[key])
        self.max_in_flight = max(self.max_in_flight, sum(self._in_flight.values()))
        try:
            response = await self._answer(request, body)
        finally:
            self._in_flight[key] -= 1
        return response

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        mid = body["message_id"]
        call = {"body": body, "headers": dict(request.headers), "at": time.monotonic()}
        self.calls.append(call)
        if self.down:
            call["outcome"] = 503
            return web.Response(status=503, text="down")
        script = self.scripts.get(mid)
        step = script.pop(0) if script else 200
        if isinstance(step, tuple):
            status, headers = step
        elif isinstance(step, float):
            await asyncio.sleep(step)
            status, headers = 200, {}
        else:
            status, headers = step, {}
        if self.delay:
            await asyncio.sleep(self.delay)
        if status == 200:
            if self.applied[mid]:
                call["outcome"] = 409
                return web.Response(status=409, text="already applied")
            self.applied[mid] += 1
        call["outcome"] = status
        return web.Response(status=status, headers=headers, text=f"scripted {status}")


@contextlib.asynccontextmanager
async def serving(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]], port: int
) -> AsyncIterator[None]:
    """``POST /handle`` answered by ``handle`` on 127.0.0.1:``port`` while inside."""
    app = web.Application()
    app.router.add_post("/handle", handle)
    # A scripted answer still sleeping when the test ends (a consumer killed mid-call) is
    # cancelled a second later, not waited for (aiohttp's default: a minute).
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


@pytest.fixture
async def handler() -> AsyncIterator[ScriptedHandler]:
    scripted = ScriptedHandler()
    async with serving(scripted.handle, scripted.port):
        yield scripted


def fast_durable(env: Env, url: str, **overrides: Any) -> None:
    """Shorten the durable's clocks so retries happen in test time. The circuit breaker
    is off unless a test turns it on (``circuit_breaker={...}``): these tests script
    failures per event and count the deliveries they spend (tests/consumer/test_breaker.py
    is the breaker's)."""
    durable = env.doc["durables"][DURABLE]
    durable.update(
        ack_wait="3s",
        max_deliver=4,
        backoff=["200ms", "200ms", "200ms"],
        handler={"url": url, "timeout": "1s"},
        circuit_breaker={"enabled": False},
    )
    durable.update(overrides)
    env.write()


class RunningConsumer:
    """The role's consumer class, in-process."""

    def __init__(
        self,
        env: Env,
        nc: NATS,
        url: str,
        *,
        concurrency: int = 16,
        durable: str = DURABLE,
        dsn: str | None = None,
    ) -> None:
        self.env, self.nc, self.url, self.concurrency = env, nc, url, concurrency
        self.durable, self.dsn = durable, dsn
        self.stop = asyncio.Event()

    async def __aenter__(self) -> ConsumerLoop:
        spec = self.env.topology.durables[self.durable]
        self.pool = await asyncpg.create_pool(
            self.dsn or self.env.dsn("sea"), min_size=1, max_size=4
        )
        self.http = HttpHandler(
            self.url, timeout=spec.handler.timeout, connections=self.concurrency
        )
        self.consumer = build_consumer(
            pool=self.pool,
            js=self.nc.jetstream(),
            durable=self.durable,
            spec=spec,
            handler=self.http,
            owner=f"test-{uuid.uuid4().hex[:6]}",
            concurrency=self.concurrency,
            lease_seconds=spec.handler.timeout + 2,
            policy=RetryPolicy(tuple(spec.backoff), spec.max_deliver, 5.0),
            accepted=accepted_events(self.env.topology, self.durable),
        )
        self.task = asyncio.create_task(self.consumer.run(self.stop, fetch_timeout=0.2))
        return self.consumer

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=20)
        await self.http.close()
        await self.pool.close()


def envelope(event_type: str = "vibe_created", version: int = 1, **payload: Any) -> Envelope:
    """A well-formed VibesPro envelope."""
    body = {"vibe_id": "v1", "title": "t", **payload}
    if version == 2:
        body.setdefault("owner_id", "o1")
    return Envelope(
        message_id=str(uuid.uuid4()),
        subject=f"vibespro.event.{event_type}.v{version}",
        context="vibespro",
        event_type=event_type,
        event_version=version,
        occurred_at=datetime.now(UTC),
        aggregate_type="vibe",
        aggregate_id=body["vibe_id"],
        payload=body,
    )


async def publish(nc: NATS, env_: Envelope, *, msg_id: str | None = None) -> None:
    await nc.jetstream().publish(
        env_.subject, env_.to_wire(), headers={"Nats-Msg-Id": msg_id or env_.message_id}
    )


async def publish_raw(nc: NATS, subject: str, data: bytes, msg_id: str | None = None) -> None:
    headers = {"Nats-Msg-Id": msg_id} if msg_id else None
    await nc.jetstream().publish(subject, data, headers=headers)


@pytest.fixture
async def world(env: Env, nc: NATS, handler: ScriptedHandler) -> Env:
    fast_durable(env, handler.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    return env


async def inbox_row(env: Env, message_id: str) -> asyncpg.Record | None:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return await conn.fetchrow(
            "SELECT * FROM inbox_messages WHERE durable = $1 AND message_id = $2",
            DURABLE,
            uuid.UUID(message_id),
        )
    finally:
        await conn.close()


async def dead_letters(nc: NATS) -> list[dict[str, Any]]:
    """Every record in the SEA dead-letter stream."""
    return [m.body for m in await stream_messages(nc.jetstream(), "SEA_DLQ")]
