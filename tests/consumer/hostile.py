"""A handler that misbehaves on cue, for the consumer's robustness tests.

Each message id can be given a script of answers (a status with any body and headers, a
body reset mid-way, a body trickled past the timeout); past its script a message is
applied once (200, then 409). While ``overloaded_until`` lies ahead every call gets the
``overload`` answer instead. Calls, delivery attempts and applications are recorded per
message id: the independent record the tests count against.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from aiohttp import web

from devstack.ports import free_port
from tests.conftest import Env
from tests.consumer.conftest import DURABLE, inbox_row
from tests.helpers import eventually

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HostileHandler:
    """Answers each message id from its script (then 200, applied once, 409 after)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.scripts: dict[str, list[Answer]] = {}
        self.calls: dict[str, list[float]] = defaultdict(list)
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self.applied: dict[str, int] = defaultdict(int)
        #: Bytes of each call's body, as they came over the wire.
        self.sizes: dict[str, list[int]] = defaultdict(list)
        #: While set and in the future, every call is answered by this instead.
        self.overloaded_until = 0.0
        self.overload: Answer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/handle"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        mid = body["message_id"]
        self.sizes[mid].append(len(raw))
        self.calls[mid].append(time.monotonic())
        self.attempts[mid].append(body["delivery"]["attempt"])
        if self.overload is not None and time.monotonic() < self.overloaded_until:
            return await self.overload(request)
        script = self.scripts.get(mid)
        if script:
            return await script.pop(0)(request)
        if self.applied[mid]:
            return web.Response(status=409)
        self.applied[mid] += 1
        return web.Response(status=200)


def status(code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, body=body, headers=headers)

    return answer


def reset_mid_body(code: int) -> Answer:
    """Promise 100 kB, send a little, then drop the connection."""

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=code, headers={"Content-Length": "100000"})
        await resp.prepare(request)
        await resp.write(b"partial body ")
        await resp.drain()
        assert request.transport is not None
        request.transport.abort()
        return resp

    return answer


def trickle(code: int, seconds: float) -> Answer:
    """Headers at once, then one byte every 100 ms for ``seconds`` (past the timeout)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=code, headers={"Content-Length": "100000"})
        await resp.prepare(request)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                await resp.write(b".")
                await asyncio.sleep(0.1)
        except (ConnectionResetError, OSError):
            pass  # the consumer hung up: expected
        return resp

    return answer


@pytest.fixture
async def hostile() -> AsyncIterator[HostileHandler]:
    hostile = HostileHandler()
    app = web.Application()
    app.router.add_post("/handle", hostile.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", hostile.port).start()
    try:
        yield hostile
    finally:
        await runner.cleanup()


async def _settled(env: Env, message_id: str, status_: str) -> bool:
    row = await inbox_row(env, message_id)
    return row is not None and row["status"] == status_


async def until_all(
    env: Env, ids: list[str], status_: str = "processed", *, timeout: float = 30
) -> None:
    """Wait until every id's inbox row has ``status_``."""

    async def done() -> bool:
        return all([await _settled(env, mid, status_) for mid in ids])

    await eventually(done, timeout=timeout, what=f"all {status_}")


async def dead_letter_rows(env: Env) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return list(await conn.fetch("SELECT * FROM dead_letters WHERE durable = $1", DURABLE))
    finally:
        await conn.close()
