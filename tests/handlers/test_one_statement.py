"""Routes marked @one_statement: claim, effect and ledger row as one statement.

The same contract as a transaction's route — 200 once, 409 after (effect once), every
call in the ledger, nothing committed by a call that fails — checked by counting rows,
on routes written for the purpose: one with its own WITH clause, one whose effect
fails on a duplicate before the claim does, one that fails for real.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.handlers.request import HandleRequest
from services.handlers.service import HandlerService, is_one_statement, one_statement
from shared.adapters.postgres import Statement
from shared.domain.errors import PoisonError
from shared.sdk.store import one_statement_sql
from tests.conftest import Env

from .conftest import make_doc

pytestmark = pytest.mark.integration

TABLES = (
    "CREATE TABLE IF NOT EXISTS t_notes (note TEXT PRIMARY KEY, length INT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS t_once (message_id UUID PRIMARY KEY)",
)


@one_statement
def with_own_cte(request: HandleRequest) -> Statement:
    """Its own WITH clause, merged with the claim's."""
    title = request.payload["title"]
    if title == "poison":
        raise PoisonError("TEST_POISON", "title 'poison' is refused")
    return Statement(
        "WITH n AS (SELECT $1::text AS note)"
        " INSERT INTO t_notes (note, length) SELECT note, length(note) FROM n"
        " ON CONFLICT (note) DO UPDATE SET length = t_notes.length + EXCLUDED.length",
        (title,),
    )


@one_statement
def unique_by_message(request: HandleRequest) -> Statement:
    """A second guard: a duplicate fails here, on its own index, before the claim does."""
    return Statement(
        "INSERT INTO t_once (message_id) VALUES ($1)", (uuid.UUID(request.message_id),)
    )


ROUTES = {("vibe_created", 1): with_own_cte, ("vibe_created", 2): unique_by_message}


@pytest.fixture
async def service(env: Env) -> AsyncIterator[HandlerService]:
    pool = await asyncpg.create_pool(env.dsn("sea"), min_size=1, max_size=8)
    try:
        svc = HandlerService(name="sea", pool=pool, routes=ROUTES, tables=TABLES)
        await svc.install()
        yield svc
    finally:
        await asyncio.wait_for(pool.close(), timeout=10)


async def call(svc: HandlerService, doc: dict[str, Any]) -> int:
    outcome = await svc.handle(json.dumps(doc).encode(), {"Idempotency-Key": doc["message_id"]})
    return outcome.status


async def ledger(svc: HandlerService, doc: dict[str, Any]) -> list[int]:
    async with svc._pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT status FROM handler_calls WHERE message_id = $1 ORDER BY id",
            uuid.UUID(doc["message_id"]),
        )
    return [r["status"] for r in rows]


async def count(svc: HandlerService, sql: str) -> int:
    async with svc._pool.acquire() as conn:
        return int(await conn.fetchval(sql))


def note(title: str, attempt: int = 1, message_id: str | None = None) -> dict[str, Any]:
    return make_doc(
        "vibe_created", 1, {"vibe_id": "v", "title": title}, attempt=attempt, message_id=message_id
    )


def test_routes_are_told_apart() -> None:
    assert is_one_statement(with_own_cte)

    async def classic(conn: Any, request: HandleRequest) -> None: ...

    assert not is_one_statement(classic)


def test_the_statement_keeps_its_own_with_clause_and_argument_numbers() -> None:
    sql = one_statement_sql("-- note\n with recursive r AS (SELECT $1) DELETE FROM x", 1)
    assert sql.startswith("WITH RECURSIVE ferry_claim AS (")
    assert sql.endswith(", r AS (SELECT $1) DELETE FROM x")
    assert "VALUES ($2, $3, clock_timestamp())" in sql and "VALUES ($2, $3, $4, 200)" in sql


async def test_applied_once_then_409_with_every_call_in_the_ledger(
    service: HandlerService,
) -> None:
    doc = note("hello")
    assert await call(service, doc) == 200
    assert await call(service, {**doc, "delivery": {**doc["delivery"], "attempt": 2}}) == 409
    assert await count(service, "SELECT length FROM t_notes WHERE note = 'hello'") == 5
    assert await count(service, "SELECT count(*) FROM handler_applied") == 1
    assert await ledger(service, doc) == [200, 409]


async def test_concurrent_deliveries_apply_once(service: HandlerService) -> None:
    doc = note("race")
    statuses = await asyncio.gather(*(call(service, doc) for _ in range(8)))
    assert sorted(statuses) == [200] + [409] * 7
    assert await count(service, "SELECT length FROM t_notes WHERE note = 'race'") == 4
    assert sorted(await ledger(service, doc)) == [200] + [409] * 7


async def test_a_duplicate_whose_effect_fails_first_is_still_409(service: HandlerService) -> None:
    doc = make_doc("vibe_created", 2, {"vibe_id": "v", "title": "t", "owner_id": "o"})
    assert [await call(service, doc) for _ in range(3)] == [200, 409, 409]
    assert await count(service, "SELECT count(*) FROM t_once") == 1
    assert await ledger(service, doc) == [200, 409, 409]


async def test_a_failing_statement_commits_nothing_but_its_ledger_row(
    service: HandlerService,
) -> None:
    async with service._pool.acquire() as conn:
        await conn.execute("DROP TABLE t_notes")
    doc = note("lost")
    assert await call(service, doc) == 500
    assert await count(service, "SELECT count(*) FROM handler_applied") == 0
    assert await ledger(service, doc) == [500]
    await service.install()
    assert await call(service, doc) == 200, "the claim rolled back with the effect"
    assert await ledger(service, doc) == [500, 200]


async def test_poison_from_the_route_is_422_and_recorded(service: HandlerService) -> None:
    doc = note("poison")
    assert await call(service, doc) == 422
    assert await count(service, "SELECT count(*) FROM handler_applied") == 0
    assert await ledger(service, doc) == [422]


async def test_an_unstorable_value_is_422(service: HandlerService) -> None:
    doc = note("nul\x00byte")
    assert await call(service, doc) == 422
    assert await count(service, "SELECT count(*) FROM t_notes") == 0
    assert await ledger(service, doc) == [422]
