"""Fixtures for ``ferry handler-check``: a world without NATS, a handler that keeps the
contract by hand and the same handler broken on purpose, one fault at a time."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devstack.postgres import PostgresServer
from shared.adapters.postgres import migrate_database
from shared.contracts.events import accepted_events
from shared.domain.envelope import parse_json_body
from shared.domain.signing import SignatureError, verify
from tests.conftest import Env, sea_vibespro_doc

SECRET = "handler-check-secret"
DURABLE = "sea__from_vibespro"
#: The faults a broken handler can be built with.
FAULTS = frozenset(
    {
        "accepts-bad-signature",  # never verifies the signature: 200 to anything
        "ignores-timestamp",  # verifies the HMAC but not the age
        "poison-500",  # a schema-invalid payload crashes it: 500
        "applies-duplicates",  # no claim: a redelivery is applied again, 200
        "duplicate-200-no-effect",  # a redelivery answers 200 without a second effect
    }
)
EFFECT_TABLE = """
CREATE TABLE IF NOT EXISTS hc_effects (
  id BIGSERIAL PRIMARY KEY, message_id UUID NOT NULL, payload JSONB NOT NULL
);
CREATE TABLE IF NOT EXISTS hc_claims (message_id UUID PRIMARY KEY);
"""
#: The query that sees the hand-made handler's effects.
EFFECT_SQL = "SELECT count(*) FROM hc_effects"


@pytest.fixture
async def world(tmp_path: Path, pg_server: PostgresServer) -> Env:
    """The sea-vibespro topology on fresh, migrated databases; no NATS (no call needs it)."""
    prefix = "t" + uuid.uuid4().hex[:10]
    found = Env(tmp_path, pg_server, "", sea_vibespro_doc(prefix))
    for database in found.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await asyncio.wait_for(found.grant_roles(), timeout=60)
    return found


class HandMadeHandler:
    """The handler contract written by hand over aiohttp (as a team without the SDK
    would), with ``faults`` breaking it on purpose."""

    def __init__(self, world: Env, pool: asyncpg.Pool, faults: frozenset[str]) -> None:
        unknown = faults - FAULTS
        assert not unknown, f"unknown faults {unknown}"
        self.pool, self.faults = pool, faults
        accepted = accepted_events(world.topology, DURABLE)
        assert accepted is not None
        self.accepted = accepted

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        refused = self._refused(request.headers, body)
        if refused is not None:
            return web.json_response({"reason_code": "BAD_SIGNATURE", "error": refused}, status=401)
        doc = parse_json_body(body)
        key = (doc["event_type"], doc["event_version"])
        if key not in self.accepted:
            return web.json_response({"reason_code": "UNKNOWN_EVENT"}, status=422)
        problem = self.accepted.payload_error(key, doc["payload"])
        if problem is not None:
            if "poison-500" in self.faults:
                return web.json_response({"error": "KeyError"}, status=500)
            return web.json_response(
                {"reason_code": "SCHEMA_INVALID", "error": problem}, status=422
            )
        return await self._apply(uuid.UUID(doc["message_id"]), doc["payload"])

    def _refused(self, headers: Mapping[str, str], body: bytes) -> str | None:
        if "accepts-bad-signature" in self.faults:
            return None
        tolerance = 1e12 if "ignores-timestamp" in self.faults else 300.0
        try:
            verify({DURABLE: SECRET.encode()}, headers, body, now=time.time(), tolerance=tolerance)
        except SignatureError as exc:
            return str(exc)
        return None

    async def _apply(self, message_id: uuid.UUID, payload: dict[str, Any]) -> web.Response:
        async with self.pool.acquire() as conn, conn.transaction():
            if "applies-duplicates" not in self.faults:
                claimed = await conn.fetchval(
                    "INSERT INTO hc_claims VALUES ($1) ON CONFLICT DO NOTHING RETURNING true",
                    message_id,
                )
                if not claimed:
                    status = 200 if "duplicate-200-no-effect" in self.faults else 409
                    return web.json_response({"status": "already_processed"}, status=status)
            await conn.execute(
                "INSERT INTO hc_effects (message_id, payload) VALUES ($1, $2)",
                message_id,
                json.dumps(payload),
            )
        return web.json_response({"status": "processed"})


@asynccontextmanager
async def hand_made(world: Env, *faults: str) -> AsyncIterator[str]:
    """Serve a :class:`HandMadeHandler` with ``faults`` on the sea database; its URL."""
    pool = await asyncpg.create_pool(world.dsn("sea"), min_size=1, max_size=4)
    try:
        await pool.execute(EFFECT_TABLE)
        handler = HandMadeHandler(world, pool, frozenset(faults))
        app = web.Application()
        app.router.add_post("/handle", handler.handle)
        async with TestServer(app, host="127.0.0.1") as server:
            yield str(server.make_url("/handle"))
    finally:
        await asyncio.wait_for(pool.close(), timeout=10)
