"""The SDK's batch calls over real HTTP against a real PostgreSQL, in both modes: events
one after the other in their own transactions (the default), and ONE transaction for the
batch with a savepoint per event (``batch_transaction=True``).

Effects are counted in the database (the invoices table, the claims, the ledger), not in
what the handler answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from devstack.ports import free_port
from shared.domain.envelope import MAX_PAYLOAD_DEPTH, json_defect
from shared.sdk import Handler
from shared.sdk.aiohttp_app import aiohttp_app
from shared.sdk.testing import SigningClient, batch_results
from tests.sdk.test_handler_http import DURABLE, SECRET, billing, dsn, payload_module

pytestmark = pytest.mark.integration
__all__ = ["dsn"]  # the fixture

#: A deferred unique index: a second row with one key fails only at COMMIT.
LATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS late (k TEXT, CONSTRAINT late_k UNIQUE (k)"
    " DEFERRABLE INITIALLY DEFERRED)"
)

TALLY_TABLE = "CREATE TABLE IF NOT EXISTS tallies (k TEXT PRIMARY KEY, n INT NOT NULL)"


class Served:
    def __init__(self, url: str, pool: asyncpg.Pool, handler: Handler) -> None:
        self.url, self.pool, self.handler = url, pool, handler

    async def count(self, sql: str, *args: Any) -> int:
        async with self.pool.acquire() as conn:
            return int(await conn.fetchval(sql, *args))


@pytest.fixture(params=["per-event", "one-transaction"])
async def served(request: pytest.FixtureRequest, dsn: str, tmp_path: Path) -> AsyncIterator[Served]:
    handler = billing(payload_module(tmp_path))
    handler.ledger = True
    handler.tables = (*handler.tables, LATE_TABLE, TALLY_TABLE)
    handler.batch_transaction = request.param == "one-transaction"

    @handler.route("tally_noted", 1)
    async def tally_noted(conn: Any, call: Any) -> None:
        await conn.execute(
            "INSERT INTO tallies VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = tallies.n + 1",
            call.payload["k"],
        )
        await conn.execute("SELECT pg_sleep($1)", float(call.payload.get("sleep", 0)))

    @handler.route("late_noted", 1)
    async def late_noted(conn: Any, call: Any) -> None:
        await conn.execute("INSERT INTO late VALUES ($1)", call.payload["k"])

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    handler.bind(pool)
    port = free_port()
    runner = web.AppRunner(aiohttp_app(handler, secrets={DURABLE: SECRET}))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Served(f"http://127.0.0.1:{port}/handle", pool, handler)
    finally:
        await runner.cleanup()
        await pool.close()


def _client(served: Served) -> SigningClient:
    return SigningClient(served.url, durable=DURABLE, secret=SECRET)


async def test_each_event_gets_its_own_answer_and_only_good_effects_commit(
    served: Served,
) -> None:
    async with _client(served) as ferry:
        paid = {
            name: ferry.call("order_paid", 1, {"order_id": name, "amount": 10}, context="shop")
            for name in ("ok", "dup", "busy", "closed", "boom-after-effect", "ok2")
        }
        paid["high"] = ferry.call("order_paid", 1, {"order_id": "high", "amount": 5000},
                                  context="shop")  # fmt: skip
        unknown = ferry.call("order_refunded", 1, {"order_id": "x"}, context="shop")
        assert (await ferry.send(paid["dup"])).status == 200  # applied before the batch
        calls = [*paid.values(), unknown]
        reply = await ferry.send_batch(calls)
    assert reply.status == 200, reply.text
    assert reply.body["ferry_batch"] == 1
    results = batch_results(reply)
    assert [r["id"] for r in reply.body["results"]] == [c.message_id for c in calls]
    status = {name: results[call.message_id]["status"] for name, call in paid.items()}
    assert status == {"ok": 200, "dup": 409, "busy": 503, "closed": 500,
                      "boom-after-effect": 500, "ok2": 200, "high": 422}  # fmt: skip
    assert results[unknown.message_id]["status"] == 422
    assert results[unknown.message_id]["error"]["reason_code"] == "UNKNOWN_EVENT"
    busy = results[paid["busy"].message_id]
    assert busy["retry_after"] == 7 and busy["retryable"] is True
    assert results[paid["closed"].message_id]["retryable"] is False
    assert results[paid["high"].message_id]["error"]["reason_code"] == "AMOUNT_TOO_HIGH"
    assert results[paid["boom-after-effect"].message_id]["retryable"] is True
    # Only the 200s' effects (and the earlier one) exist; a failed event's effect and claim
    # were rolled back, the others' kept.
    invoices = await served.count("SELECT count(*) FROM invoices")
    assert invoices == 3
    kept = await served.count(
        "SELECT count(*) FROM invoices WHERE order_id = ANY($1)", ["ok", "ok2", "dup"]
    )
    assert kept == 3
    claims = await served.count("SELECT count(*) FROM handler_applied")
    assert claims == 3
    # Every event of the batch is in the ledger with the status it was answered.
    async with served.pool.acquire() as conn:
        rows = await conn.fetch("SELECT message_id, status FROM handler_calls")
    ledger = {str(r["message_id"]): r["status"] for r in rows}
    assert all(ledger[c.message_id] == results[c.message_id]["status"] for c in calls)


async def test_a_duplicate_inside_a_batch_is_a_409_for_that_event_only(served: Served) -> None:
    async with _client(served) as ferry:
        one = ferry.call("order_paid", 1, {"order_id": "o-1", "amount": 1}, context="shop")
        other = ferry.call("order_paid", 1, {"order_id": "o-2", "amount": 1}, context="shop")
        reply = await ferry.send_batch([one, other, one.again()])
        again = await ferry.send_batch([one.again(), other.again()])
    assert [r["status"] for r in reply.body["results"]] == [200, 200, 409]
    assert [r["status"] for r in again.body["results"]] == [409, 409]
    assert await served.count("SELECT count(*) FROM invoices") == 2


async def test_a_batch_that_cannot_be_read_is_a_400(served: Served) -> None:
    async with _client(served) as ferry:
        headers = {"Ferry-Batch": "1", "Content-Type": "application/json"}
        wrong = [
            (b"[1, 2]", "MALFORMED_BATCH"),
            (b'{"ferry_batch": 2, "events": [{}]}', "UNSUPPORTED_BATCH_VERSION"),
            (b'{"ferry_batch": 1, "events": []}', "MALFORMED_BATCH"),
            (b"not json", "MALFORMED_JSON"),
        ]
        for body, code in wrong:
            reply = await ferry.post(body, headers)
            assert reply.status == 400, body
            assert reply.body["reason_code"] == code
        # An event that is no call (no id to answer for) gets no result; the rest do.
        good = ferry.call("order_paid", 1, {"order_id": "o-9", "amount": 1}, context="shop")
        doc = {"ferry_batch": 1, "events": [{"what": "no envelope"}, good.document()]}
        reply = await ferry.post(json.dumps(doc).encode(), headers)
    assert reply.status == 200
    assert [r["id"] for r in reply.body["results"]] == [good.message_id]


async def test_a_batch_is_signed_like_any_call(served: Served) -> None:
    async with _client(served) as ferry:
        call = ferry.call("order_paid", 1, {"order_id": "o-3", "amount": 1}, context="shop")
        unsigned = await ferry.send_batch([call], sign=False)
        stale = await ferry.send_batch([call], signed_at=1_000_000.0)
    assert unsigned.status == 401 and stale.status == 401
    assert await served.count("SELECT count(*) FROM invoices") == 0


async def test_a_batch_transaction_that_cannot_commit_commits_nothing(served: Served) -> None:
    async with _client(served) as ferry:
        first = ferry.call("late_noted", 1, {"k": "same"}, context="shop")
        second = ferry.call("late_noted", 1, {"k": "same"}, context="shop")
        paid = ferry.call("order_paid", 1, {"order_id": "o-4", "amount": 1}, context="shop")
        reply = await ferry.send_batch([paid, first, second])
    if not served.handler.batch_transaction:
        # One transaction per event: the second insert fails its own commit only.
        statuses = [r["status"] for r in reply.body["results"]]
        assert statuses[0] == 200 and statuses[1] == 200 and statuses[2] >= 500
        return
    # One transaction: its commit fails on the deferred index, so the whole call is
    # answered 5xx (every event retried) and nothing of the batch exists.
    assert reply.status >= 500 and reply.body["retryable"] is True
    assert await served.count("SELECT count(*) FROM invoices") == 0
    assert await served.count("SELECT count(*) FROM late") == 0
    assert await served.count("SELECT count(*) FROM handler_applied") == 0


async def test_batches_updating_the_same_rows_in_opposite_orders_both_commit(
    served: Served,
) -> None:
    """Two batch transactions that lock the same two rows in opposite orders deadlock;
    the one PostgreSQL aborts goes again, so both answer 200 for every event."""
    async with _client(served) as ferry:

        def tally(key: str, sleep: float = 0.0) -> Any:
            return ferry.call("tally_noted", 1, {"k": key, "sleep": sleep}, context="shop")

        first = [tally("a", 0.4), tally("b")]
        second = [tally("b", 0.4), tally("a")]
        replies = await asyncio.gather(ferry.send_batch(first), ferry.send_batch(second))
    for reply in replies:
        assert reply.status == 200, reply.text
        assert [r["status"] for r in reply.body["results"]] == [200, 200], reply.text
    async with served.pool.acquire() as conn:
        counts = dict(await conn.fetch("SELECT k, n FROM tallies"))
    assert counts == {"a": 2, "b": 2}


async def test_one_statement_routes_of_a_batch_travel_as_one_pipelined_execution(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With batch_transaction, N events of one one-statement route are one executemany:
    every effect commits, in the batch's order, and each event gets its 200."""
    runs: list[int] = []
    original = asyncpg.connection.Connection.executemany

    async def counted(self: Any, sql: str, args: Any, **kw: Any) -> Any:
        runs.append(len(args))
        return await original(self, sql, args, **kw)

    monkeypatch.setattr(asyncpg.connection.Connection, "executemany", counted)
    async with _client(served) as ferry:
        calls = [ferry.call("order_noted", 1, {}, context="shop") for _ in range(20)]
        reply = await ferry.send_batch(calls)
    assert reply.status == 200, reply.text
    results = batch_results(reply)
    assert all(results[c.message_id]["status"] == 200 for c in calls)
    assert await served.count("SELECT count(*) FROM invoices") == 20
    assert await served.count("SELECT count(*) FROM handler_applied") == 20
    # One pipelined execution in the one-transaction mode; none event by event.
    assert runs == ([20] if served.handler.batch_transaction else [])


async def test_a_statement_failing_inside_a_pipelined_run_fails_alone(served: Served) -> None:
    """One event's statement fails in the middle of a pipelined run: nothing of the run
    stays; the batch goes again event by event, that event answers 500, the others 200."""
    async with _client(served) as ferry:
        calls = [ferry.call("order_noted", 1, {}, context="shop") for _ in range(10)]
        taken = calls[4].message_id
        async with served.pool.acquire() as conn:  # its invoice exists: its INSERT fails
            await conn.execute("INSERT INTO invoices VALUES ($1, 99)", taken)
        reply = await ferry.send_batch(calls)
    assert reply.status == 200, reply.text
    results = batch_results(reply)
    status = {c.message_id: results[c.message_id]["status"] for c in calls}
    assert status.pop(taken) == 500
    assert set(status.values()) == {200}
    assert await served.count("SELECT count(*) FROM invoices") == 10
    assert await served.count("SELECT amount FROM invoices WHERE order_id = $1", taken) == 99
    assert await served.count("SELECT count(*) FROM handler_applied") == 9


async def test_an_event_nested_as_deep_as_a_payload_may_be_is_applied_in_a_batch(
    served: Served,
) -> None:
    """A batch nests its events two levels down: an event at the deepest a payload may
    be is applied as it would be on its own, not refused with the whole batch."""
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(MAX_PAYLOAD_DEPTH - 2):
        inner["d"] = {}
        inner = inner["d"]
    payload = {"k": "deep", "deep": deep}
    assert json_defect(payload) is None  # the deepest allowed …
    assert json_defect({"k": "x", "deep": {"d": deep}}) is not None  # … one more is not
    async with _client(served) as ferry:
        calls = [
            ferry.call("tally_noted", 1, payload, context="shop"),
            ferry.call("tally_noted", 1, {"k": "flat"}, context="shop"),
        ]
        reply = await ferry.send_batch(calls)
    assert reply.status == 200, reply.text
    assert [r["status"] for r in reply.body["results"]] == [200, 200]
    assert await served.count("SELECT count(*) FROM tallies") == 2
