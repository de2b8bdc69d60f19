"""The console while it starts: its port is open before its connections are, and a
readiness probe (or a page) hit in that window answers 503 "starting", never a 500 with a
traceback (issue 49: ``readyz`` iterated the pools while start-up was still adding them).

PostgreSQL is reached through a gate the test holds shut, so the start-up window lasts as
long as the test wants, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest

from devstack.ports import free_port
from shared.access.identities import identity_named
from tests.conftest import Env

from .conftest import TOKEN, _start, _stop

pytestmark = pytest.mark.integration

#: Seconds the gate stays shut after the console's port first answers.
HELD = 1.5


class Gate:
    """A TCP relay to PostgreSQL whose connections wait until :meth:`open`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.opened = asyncio.Event()
        self.waiting = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def open(self) -> None:
        self.opened.set()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.waiting += 1
        await self.opened.wait()
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(ConnectionError, OSError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def gated(env: Env) -> AsyncIterator[tuple[Gate, dict[str, str]]]:
    """A gate in front of the test's PostgreSQL and the console's DSNs through it."""
    role = f"console-{env.topology.name}"
    identity = identity_named([env.topology], role)
    first = urlsplit(env.pg.dsn(next(iter(env.topology.databases()))))
    gate = Gate(first.hostname or "127.0.0.1", first.port or 5432)
    port = await gate.start()
    databases = {}
    for database in env.topology.databases():
        parts = urlsplit(env.role_dsn(identity, database))
        user = parts.netloc.rsplit("@", 1)[0]
        databases[database] = urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}"))
    try:
        yield gate, databases
    finally:
        gate.open()
        await gate.close()


async def test_readyz_and_pages_answer_503_until_started_never_500(
    env: Env, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    console_port = free_port()
    url = f"http://127.0.0.1:{console_port}"
    async with gated(env) as (gate, databases):
        proc = _start(
            env,
            "console",
            ["services.console"],
            logs,
            role=f"console-{env.topology.name}",
            FERRY_CONSOLE_PORT=str(console_port),
            FERRY_CONSOLE_TOKEN_FILE=str(tmp_path / "token"),
            FERRY_DATABASES=json.dumps(databases),
        )
        statuses: list[tuple[int, object]] = []
        pages: list[int] = []
        opened_at: float | None = None
        try:
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    assert proc.poll() is None, f"console exited with {proc.returncode}"
                    try:
                        async with session.get(f"{url}/readyz") as resp:
                            body = await resp.json()
                            statuses.append((resp.status, body))
                        if statuses[-1][0] == 503 and len(pages) < 5:
                            # A page hit while starting: a page in words, not a KeyError.
                            async with session.get(
                                f"{url}/", headers={"Authorization": f"Bearer {TOKEN}"}
                            ) as resp:
                                pages.append(resp.status)
                                assert resp.headers.get("Retry-After"), resp.headers
                    except (aiohttp.ClientConnectionError, OSError):
                        await asyncio.sleep(0.002)  # not listening yet: try again at once
                        continue
                    if statuses[-1][0] == 200:
                        break
                    if opened_at is None:
                        opened_at = time.monotonic()
                    elif time.monotonic() - opened_at > HELD:
                        gate.open()
        finally:
            await _stop(proc)
    log = (logs / "console.log").read_text(errors="replace")
    codes = [status for status, _ in statuses]
    assert codes and codes[-1] == 200, f"never ready: {codes[-5:]}\n{log[-2000:]}"
    assert 500 not in codes and 500 not in pages, f"a 500 while starting\n{log[-3000:]}"
    starting = [body for status, body in statuses if status == 503]
    assert len(starting) >= 10, f"the start-up window was not probed: {codes[:20]}"
    assert all(body == {"ready": False, "failing": ["starting"]} for body in starting), starting[:3]
    assert pages and set(pages) == {503}, pages
    assert gate.waiting >= 1, "the console reached PostgreSQL without the gate"
    assert "Traceback" not in log, log[-3000:]
    assert "failed (ref" not in log, log[-3000:]
