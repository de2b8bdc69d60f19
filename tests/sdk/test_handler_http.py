"""The SDK over real HTTP, on both adapters (aiohttp and ASGI under uvicorn), against a
real PostgreSQL: signature, parsing, typed payloads, the claim, outcomes, the test client.

The handler here is what a team would write: generated models, routes on their own table.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import pytest
import uvicorn
from aiohttp import web

from devstack.ports import free_port
from devstack.postgres import PostgresServer
from shared.adapters.postgres import Statement
from shared.domain.errors import ConfigurationError
from shared.sdk import Call, GiveUp, Handler, Reject, Retry, claim, one_statement
from shared.sdk.aiohttp_app import aiohttp_app
from shared.sdk.asgi import asgi_app
from shared.sdk.models import EventSchema, generate_models
from shared.sdk.store import NotInTransaction
from shared.sdk.testing import HandlerCall, SigningClient

pytestmark = pytest.mark.integration

DURABLE = "billing__from_shop"
SECRET = b"s3cret-for-tests"
PAID = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string", "minLength": 1},
        "amount": {"type": "number", "minimum": 0},
        "currency": {"enum": ["EUR", "USD"]},
    },
}
TABLE = "CREATE TABLE IF NOT EXISTS invoices (order_id TEXT PRIMARY KEY, amount NUMERIC)"


def payload_module(tmp_path: Path) -> ModuleType:
    """The team's generated models module, imported."""
    source = generate_models(
        [
            EventSchema("order_paid", 1, PAID, "An order was paid."),
            EventSchema("order_noted", 1, {"type": "object"}),
        ],
        source="a test",
    )
    path = tmp_path / "payloads.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("payloads_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def billing(payloads: ModuleType) -> Handler:
    handler = Handler("billing", schemas=payloads.SCHEMAS, models=payloads.MODELS, tables=[TABLE])

    @handler.route("order_paid", 1)
    async def order_paid(conn: Any, call: Call[Any]) -> None:
        paid = call.payload
        assert isinstance(paid, payloads.OrderPaidV1)
        await conn.execute("INSERT INTO invoices VALUES ($1, $2)", paid.order_id, paid.amount)
        if paid.order_id == "boom-after-effect":
            raise RuntimeError("failed after the effect")
        if paid.order_id == "busy":
            raise Retry("ledger busy", after=7)
        if paid.order_id == "closed":
            raise GiveUp("the account is closed")
        if paid.amount > 1000:
            raise Reject("AMOUNT_TOO_HIGH", "amounts over 1000 need a human")

    @handler.route("order_noted", 1)
    @one_statement
    def order_noted(call: Call[Any]) -> Statement:
        return Statement("INSERT INTO invoices VALUES ($1, 0)", (call.message_id,))

    return handler


@pytest.fixture
async def dsn(pg_server: PostgresServer) -> str:
    name = "sdk_" + uuid.uuid4().hex[:10]
    await asyncio.to_thread(pg_server.create_database, name)
    return pg_server.dsn(name)


@pytest.fixture(params=["aiohttp", "asgi"])
async def served(
    request: pytest.FixtureRequest, dsn: str, tmp_path: Path
) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    """The billing handler served over real HTTP by one adapter; (url, pool)."""
    handler = billing(payload_module(tmp_path))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    handler.bind(pool)
    port = free_port()
    secrets = {DURABLE: SECRET}
    try:
        if request.param == "aiohttp":
            runner = web.AppRunner(aiohttp_app(handler, secrets=secrets))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            try:
                yield f"http://127.0.0.1:{port}/handle", pool
            finally:
                await runner.cleanup()
        else:
            config = uvicorn.Config(
                asgi_app(handler, secrets=secrets),
                host="127.0.0.1",
                port=port,
                log_level="warning",
                lifespan="on",
            )
            server = uvicorn.Server(config)
            task = asyncio.create_task(server.serve())
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.02)
            try:
                yield f"http://127.0.0.1:{port}/handle", pool
            finally:
                server.should_exit = True
                await asyncio.wait_for(task, timeout=10)
    finally:
        await pool.close()


@pytest.fixture
async def client(served: tuple[str, asyncpg.Pool]) -> AsyncIterator[SigningClient]:
    async with SigningClient(served[0], durable=DURABLE, secret=SECRET) as ferry:
        yield ferry


def paid(client: SigningClient, order_id: str = "o-1", amount: float = 10.0) -> HandlerCall:
    return client.call("order_paid", 1, {"order_id": order_id, "amount": amount}, context="shop")


async def counts(pool: asyncpg.Pool) -> tuple[int, int]:
    invoices = await pool.fetchval("SELECT count(*) FROM invoices")
    claims = await pool.fetchval("SELECT count(*) FROM handler_applied")
    return int(invoices), int(claims)


# --- the signature ---------------------------------------------------------------------


async def test_a_signed_call_is_applied_once_then_409(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    call = paid(client)
    first = await client.send(call)
    again = await client.send(call.again())
    changed = await client.send(call.again().with_payload({"order_id": "o-1", "amount": 99}))
    assert (first.status, first.body["status"]) == (200, "processed")
    assert (again.status, again.body["status"]) == (409, "already_processed")
    assert changed.status == 409, "a duplicate id changes nothing, whatever it carries"
    assert await served[1].fetchval("SELECT amount FROM invoices") == 10
    assert await counts(served[1]) == (1, 1)


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ({"sign": False}, "missing Ferry-Durable, Ferry-Timestamp, Ferry-Signature"),
        ({"secret": b"wrong"}, "signature does not match"),
        ({"signed_at": time.time() - 3600}, "stale request"),
        ({"signed_at": time.time() + 3600}, "stale request"),
    ],
    ids=["missing", "bad", "expired", "future"],
)
async def test_a_bad_signature_is_401_and_changes_nothing(
    client: SigningClient, served: tuple[str, asyncpg.Pool], how: dict[str, Any], words: str
) -> None:
    reply = await client.send(paid(client), **how)
    assert reply.status == 401 and reply.body["reason_code"] == "BAD_SIGNATURE"
    assert words in reply.body["detail"]
    assert reply.headers["WWW-Authenticate"].startswith("Ferry-HMAC")
    assert await counts(served[1]) == (0, 0)


async def test_an_unknown_durable_or_an_altered_body_is_401(client: SigningClient) -> None:
    call = paid(client)
    other = SigningClient(client.url, durable="someone_else", secret=SECRET)
    async with other:
        assert (await other.send(call)).status == 401
    body = call.body()
    from shared.sdk.testing import signed_headers

    headers = {**call.headers(), **signed_headers(SECRET, DURABLE, body)}
    altered = body.replace(b'"amount":10.0', b'"amount":11.0')
    assert altered != body
    assert (await client.post(altered, headers, sign=False)).status == 401


# --- parsing ---------------------------------------------------------------------------


async def test_a_malformed_body_is_400_naming_the_defect(client: SigningClient) -> None:
    call = paid(client)
    for body, code in [
        (b"{not json", "MALFORMED_JSON"),
        (b"[1]", "MALFORMED_ENVELOPE"),
        (b'{"message_id": "x"}', "MISSING_FIELD"),
    ]:
        reply = await client.post(body, call.headers())
        assert reply.status == 400, reply.text
        assert reply.body["reason_code"] == code and reply.body["retryable"] is False
        assert reply.body["error"]


async def test_a_missing_idempotency_key_is_400(client: SigningClient) -> None:
    call = paid(client)
    reply = await client.post(call.body(), {"Content-Type": "application/json"})
    assert (reply.status, reply.body["reason_code"]) == (400, "MISSING_FIELD")
    assert "Idempotency-Key" in reply.body["error"]


async def test_an_unknown_event_is_422(client: SigningClient) -> None:
    reply = await client.send(client.call("order_refunded", 1, {}, context="shop"))
    assert (reply.status, reply.body["reason_code"]) == (422, "UNKNOWN_EVENT")
    assert reply.body["retryable"] is False


async def test_a_schema_violation_is_422_naming_the_path(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    for payload, words in [
        ({"order_id": "o", "amount": -1}, "payload.amount: -1 is less than the minimum of 0"),
        ({"order_id": "o"}, "payload.amount: required property is missing"),
        ({"order_id": "o", "amount": 1, "currency": "GBP"}, "payload.currency: 'GBP' is not"),
    ]:
        reply = await client.send(client.call("order_paid", 1, payload, context="shop"))
        assert (reply.status, reply.body["reason_code"]) == (422, "SCHEMA_INVALID")
        assert words in reply.body["error"]
    assert await counts(served[1]) == (0, 0)


# --- the claim and the outcomes ---------------------------------------------------------


async def test_a_failure_after_the_claim_rolls_back_the_effect_and_the_claim(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    call = paid(client, "boom-after-effect")
    reply = await client.send(call)
    assert reply.status == 500 and reply.body["retryable"] is True
    assert await counts(served[1]) == (0, 0), "the effect and the claim are one transaction"


async def test_outcomes_raised_by_a_route(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    busy = await client.send(paid(client, "busy"))
    assert (busy.status, busy.headers["Retry-After"], busy.body["retryable"]) == (503, "7", True)
    closed = await client.send(paid(client, "closed"))
    assert (closed.status, closed.body["retryable"]) == (500, False)
    high = await client.send(paid(client, "big", amount=5000))
    assert (high.status, high.body["reason_code"], high.body["retryable"]) == (
        422,
        "AMOUNT_TOO_HIGH",
        False,
    )
    assert await counts(served[1]) == (0, 0), "no outcome but 200 leaves anything behind"


async def test_concurrent_deliveries_of_one_id_apply_once(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    call = paid(client)
    replies = await asyncio.gather(*(client.send(call) for _ in range(6)))
    assert sorted(r.status for r in replies) == [200] + [409] * 5
    assert await counts(served[1]) == (1, 1)


async def test_a_one_statement_route_claims_in_the_same_statement(
    client: SigningClient, served: tuple[str, asyncpg.Pool]
) -> None:
    call = client.call("order_noted", 1, {}, context="shop")
    assert [(await client.send(c)).status for c in (call, call.again())] == [200, 409]
    assert await counts(served[1]) == (1, 1)


async def test_health_and_readiness(served: tuple[str, asyncpg.Pool]) -> None:
    async with SigningClient(served[0], durable=DURABLE, secret=SECRET) as ferry:
        base = served[0].removesuffix("/handle")
        assert ferry._session is not None
        async with ferry._session.get(base + "/healthz") as resp:
            assert resp.status == 200
        async with ferry._session.get(base + "/readyz") as resp:
            assert resp.status == 200


# --- claim() in a caller's own transaction ----------------------------------------------


async def test_claim_in_the_callers_transaction(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        handler = Handler("mine")
        handler.bind(await asyncpg.create_pool(dsn, min_size=1, max_size=1))
        await handler.install()
        await handler.pool.close()
        await conn.execute("CREATE TABLE effects (id UUID PRIMARY KEY)")
        mid = uuid.uuid4()
        with pytest.raises(NotInTransaction):
            await claim(conn, handler="mine", message_id=mid)
        with pytest.raises(RuntimeError, match="after"):
            async with conn.transaction():
                assert await claim(conn, handler="mine", message_id=mid)
                await conn.execute("INSERT INTO effects VALUES ($1)", mid)
                raise RuntimeError("failed after the claim")
        assert await conn.fetchval("SELECT count(*) FROM handler_applied") == 0
        assert await conn.fetchval("SELECT count(*) FROM effects") == 0
        async with conn.transaction():
            assert await claim(conn, handler="mine", message_id=str(mid))
            await conn.execute("INSERT INTO effects VALUES ($1)", mid)
        async with conn.transaction():
            assert not await claim(conn, handler="mine", message_id=mid), "a duplicate"
        async with conn.transaction():
            assert await claim(conn, handler="other", message_id=mid), "claims are per handler"
    finally:
        await conn.close()


def test_an_adapter_refuses_to_serve_unsigned_unless_told() -> None:
    handler = Handler("billing")
    with pytest.raises(ConfigurationError, match="no verification secrets"):
        aiohttp_app(handler)
    with pytest.raises(ConfigurationError, match="no verification secrets"):
        asgi_app(handler)
    assert aiohttp_app(handler, allow_unsigned=True) is not None
