"""The replay API's world: mediation on real servers, every role a process with its own
login — module E's publisher, cg_f_ingest and module F's handler (the lane whose dead
letters get replayed), module G's publisher, cg_replay and module G's handler running
replay jobs (the replay lane), the dlq-replayer (it settles processed replays) and the
console with an operator token and a read-only account."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml
from nats.aio.client import Client as NATS

from devstack.nats import NatsServer
from devstack.ports import free_port
from devstack.postgres import PostgresServer
from services.console.auth import hash_password
from shared.access.streams import provision
from shared.adapters.postgres import migrate_database
from shared.adapters.producer import record_event
from tests.conftest import CAPS, ROOT, Env
from tests.console.conftest import _start, _stop, wait_ready
from tests.helpers import eventually

DURABLE = "cg_f_ingest"
TOKEN = "t0ken-" + uuid.uuid4().hex
VIEWER = ("viewer", "viewer-password-1")
#: Dead letters the workload makes (rejected by module F until FIX_AFTER from now).
FIXABLE = 6
FIX_AFTER = 5.0


@dataclass
class World:
    """The running stack and what the workload recorded."""

    env: Env
    url: str
    procs: dict[str, subprocess.Popen[bytes]]
    logs: Path
    g_port: int
    fixable: list[str] = field(default_factory=list)
    fixed_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def start(self, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = _start(self.env, name, args, self.logs, **extra)
        self.procs[name] = proc
        return proc

    async def start_g_handler(self, **extra: str) -> subprocess.Popen[bytes]:
        """Module G's handler, running replay jobs, on its port; once it is ready."""
        args = ["services.handlers", "--service", "module_g", "--port", str(self.g_port)]
        proc = self.start("handler-module_g", args, FERRY_HANDLER_REPLAY_JOBS="true", **extra)
        await wait_ready(f"http://127.0.0.1:{self.g_port}/readyz", proc, "module_g's handler")
        return proc

    async def fetch(self, sql: str, *args: Any, context: str = "module_f") -> list[Any]:
        conn = await asyncpg.connect(self.env.dsn(context))
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()


async def record_scored(env: Env, faults: dict[str, Any] | None = None) -> str:
    """One opportunity_scored event in module E's outbox."""
    key = f"opp-{uuid.uuid4().hex[:8]}"
    payload: dict[str, Any] = {"opportunity_key": key, "score": 0.5}
    if faults:
        payload["_ferry_test"] = faults
    conn = await asyncpg.connect(env.dsn("module_e"))
    try:
        async with conn.transaction():
            event_id = await record_event(
                conn,
                aggregate_type="opportunity",
                aggregate_id=key,
                event_type="opportunity_scored",
                payload=payload,
                context="module_e",
            )
    finally:
        await conn.close()
    return str(event_id)


@pytest.fixture
def replay_rate() -> str:
    """FERRY_HANDLER_REPLAY_RATE of module G's handler (a test parametrizes it)."""
    return "20"


@pytest.fixture
async def world(
    tmp_path: Path,
    pg_server: PostgresServer,
    nats_server: NatsServer,
    nc: NATS,
    replay_rate: str,
) -> AsyncIterator[World]:
    doc = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    prefix = "r" + uuid.uuid4().hex[:10]
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    for durable in doc["durables"].values():  # test clocks: a retry in a second, not minutes
        durable.update(ack_wait="6s", max_deliver=4, backoff=["300ms", "300ms", "300ms"])
        durable["handler"]["timeout"] = "5s"
    # A job outlives a restart of module G's handler: its retries wait for it to be back.
    doc["durables"]["cg_replay"].update(max_deliver=10, backoff=["1s"] * 5)
    env = Env(tmp_path, pg_server, nats_server.url, doc)
    for database in env.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await asyncio.wait_for(env.grant_roles(), timeout=60)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    accounts = tmp_path / "accounts.json"
    accounts.write_text(
        json.dumps({VIEWER[0]: {"role": "read-only", "password": hash_password(VIEWER[1])}})
    )
    (tmp_path / "token").write_text(TOKEN + "\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    f_port, g_port, console_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{console_port}"
    world = World(env, url, {}, logs, g_port)
    fast = {"FERRY_FETCH_TIMEOUT": "0.2"}
    try:
        world.start(
            "handler-module_f",
            ["services.handlers", "--service", "module_f", "--port", str(f_port)],
            FERRY_HANDLER_FAULT_INJECTION="true",
        )
        await world.start_g_handler(FERRY_HANDLER_REPLAY_RATE=replay_rate)
        world.start("pub-e", ["services.outbox_publisher", "--context", "module_e"])
        world.start("pub-g", ["services.outbox_publisher", "--context", "module_g"])
        world.start(
            "con-f",
            ["services.inbox_consumer", "--durable", DURABLE],
            FERRY_HANDLER_URL=f"http://127.0.0.1:{f_port}/handle",
            **fast,
        )
        world.start(
            "con-replay",
            ["services.inbox_consumer", "--durable", "cg_replay"],
            FERRY_HANDLER_URL=f"http://127.0.0.1:{g_port}/handle",
            **fast,
        )
        world.start("dlq-replayer", ["services.dlq_replayer"], FERRY_INTERVAL="0.3")
        world.start(
            "console",
            ["services.console"],
            role=f"console-{env.topology.name}",
            FERRY_CONSOLE_PORT=str(console_port),
            FERRY_CONSOLE_ACCOUNTS_FILE=str(accounts),
            FERRY_CONSOLE_TOKEN_FILE=str(tmp_path / "token"),
            FERRY_CONSOLE_TOKEN_ROLE="operator",
        )
        await wait_ready(f"{url}/readyz", world.procs["console"], "console")
        world.fixed_at = datetime.now(UTC) + timedelta(seconds=FIX_AFTER)
        until = world.fixed_at.isoformat()
        world.fixable = [await record_scored(env, {"reject_until": until}) for _ in range(FIXABLE)]

        async def dead_lettered() -> bool:
            rows = await world.fetch("SELECT count(*) AS n FROM dead_letters")
            return bool(rows[0]["n"] == FIXABLE)

        await eventually(dead_lettered, timeout=120, what=f"{FIXABLE} dead letters", interval=0.3)
        yield world
    finally:
        for proc in world.procs.values():
            await _stop(proc)


async def api(
    world: World,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    session: aiohttp.ClientSession | None = None,
) -> tuple[int, dict[str, Any]]:
    """One call of the API: its status and JSON body."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None:
        sent.setdefault("Content-Type", "application/json")
    own = session is None
    client = session or aiohttp.ClientSession()
    try:
        async with client.request(
            method, world.url + path, data=data, headers=sent, allow_redirects=False
        ) as resp:
            assert resp.content_type == "application/json", (resp.status, await resp.text())
            return resp.status, await resp.json()
    finally:
        if own:
            await client.close()
