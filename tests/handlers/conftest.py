"""Fixtures for the handler services: a mediation world and in-process handler apps."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from devstack.postgres import PostgresServer
from services.handlers.app import make_app
from services.handlers.service import HandlerService, build_service
from services.handlers.specs import service_spec
from shared.adapters.postgres import migrate_database
from shared.domain.envelope import format_timestamp, payload_digest
from tests.conftest import ROOT, Env

#: Every HTTP exchange in these tests is bounded by this many seconds.
HTTP_TIMEOUT = 10.0


def mediation_doc(prefix: str) -> dict[str, Any]:
    """The shipped mediation topology, with databases renamed for one test."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topologies/mediation.yaml").read_text())
    for ctx in doc["contexts"].values():
        ctx["database"] = f"{prefix}_{ctx['database']}"
    return doc


@pytest.fixture
async def mediation_env(tmp_path: Path, pg_server: PostgresServer) -> Env:
    """The mediation topology on fresh, migrated databases (handlers never touch NATS)."""
    world = Env(tmp_path, pg_server, "", mediation_doc("t" + uuid.uuid4().hex[:10]))
    for database in world.topology.databases():
        await asyncio.wait_for(migrate_database(pg_server.dsn(database)), timeout=60)
    await asyncio.wait_for(world.grant_roles(), timeout=60)
    return world


def make_doc(
    event_type: str,
    version: int,
    payload: dict[str, Any],
    *,
    namespace: str = "vibespro.event",
    context: str = "vibespro",
    attempt: int = 1,
    message_id: str | None = None,
    correlation_id: str | None = None,
    durable: str = "sea__from_vibespro",
) -> dict[str, Any]:
    """A handler request body as the inbox-consumer sends it."""
    return {
        "message_id": message_id or str(uuid.uuid4()),
        "subject": f"{namespace}.{event_type}.v{version}",
        "context": context,
        "event_type": event_type,
        "event_version": version,
        "occurred_at": format_timestamp(datetime.now(UTC)),
        "correlation_id": correlation_id,
        "causation_id": None,
        "aggregate_type": "thing",
        "aggregate_id": "a1",
        "payload": payload,
        "payload_digest": payload_digest(payload),
        "delivery": {
            "attempt": attempt,
            "max_attempts": 6,
            "stream_sequence": 1,
            "durable": durable,
        },
    }


def mediation_doc_for(
    event_type: str, payload: dict[str, Any], *, lane: str, module: str, durable: str, **kw: Any
) -> dict[str, Any]:
    """A mediation request body: the envelope plus INFRA-005's names."""
    doc = make_doc(event_type, 1, payload, namespace=lane, context=module, durable=durable, **kw)
    doc.update(
        messageId=doc["message_id"],
        traceKey=doc["correlation_id"] or doc["message_id"],
        opportunityKey=payload.get("opportunity_key"),
        module=module,
        eventType=event_type,
        payloadDigest=doc["payload_digest"],
        createdAt=doc["occurred_at"],
        retryCount=doc["delivery"]["attempt"] - 1,
        maxRetries=doc["delivery"]["max_attempts"],
    )
    return doc


@dataclass
class Reply:
    """A handler's answer, read fully."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class RunningHandler:
    """A handler app served in-process on a free port, with its pool."""

    client: TestClient[web.Request, web.Application]
    pool: asyncpg.Pool
    service: HandlerService

    async def post(
        self,
        doc: dict[str, Any] | None = None,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """POST /handle; ``Idempotency-Key`` defaults to the doc's message_id."""
        if headers is None:
            headers = {"Idempotency-Key": str((doc or {}).get("message_id"))}
        data = body if body is not None else json.dumps(doc).encode()
        headers = {"Content-Type": "application/json", **headers}
        async with self.client.post("/handle", data=data, headers=headers) as resp:
            text = await resp.text()
            return Reply(resp.status, json.loads(text) if text else {}, dict(resp.headers))

    async def get(self, path: str) -> int:
        """GET ``path``; the status."""
        async with self.client.get(path) as resp:
            await resp.read()
            return resp.status

    async def calls(self, message_id: str) -> list[int | None]:
        """Statuses the effects ledger recorded for ``message_id``, in call order."""
        rows = await self.pool.fetch(
            "SELECT status FROM handler_calls WHERE message_id = $1 ORDER BY id",
            uuid.UUID(message_id),
        )
        return [r["status"] for r in rows]

    async def applied(self) -> int:
        """Rows in handler_applied."""
        return int(await self.pool.fetchval("SELECT count(*) FROM handler_applied"))


@asynccontextmanager
async def running(
    env: Env, name: str, *, fault_injection: bool = False
) -> AsyncIterator[RunningHandler]:
    """Serve handler ``name`` against ``env``'s database for its context; with
    ``fault_injection``, as FERRY_HANDLER_FAULT_INJECTION=true does."""
    pool = await asyncpg.create_pool(env.dsn(name), min_size=1, max_size=5)
    try:
        service = build_service(
            service_spec(name), pool=pool, topology=env.topology, fault_injection=fault_injection
        )
        server = TestServer(make_app(service=service))
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT)
        async with TestClient(server, timeout=timeout) as client:
            yield RunningHandler(client, pool, service)
    finally:
        await asyncio.wait_for(pool.close(), timeout=HTTP_TIMEOUT)


@pytest.fixture
async def sea(env: Env) -> AsyncIterator[RunningHandler]:
    """SEA's handler on the test's sea database, obeying ``_ferry_test`` directives."""
    async with running(env, "sea", fault_injection=True) as handler:
        yield handler


@pytest.fixture
async def vibespro(env: Env) -> AsyncIterator[RunningHandler]:
    """VibesPro's handler on the test's vibespro database."""
    async with running(env, "vibespro") as handler:
        yield handler
