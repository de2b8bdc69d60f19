"""The failure groups' fingerprint is a column PostgreSQL keeps (migration 0026), equal to
the expression the Failures page computed per request before, and kept as errors change."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from services.console.data import FINGERPRINT_SQL
from tests.conftest import Env

pytestmark = pytest.mark.integration

DURABLE = "vibespro__from_sea"
ERRORS = [
    "",
    "order 17 failed: timeout",
    "order 18 failed: timeout",  # the same group as 17
    f"vibe {uuid.uuid4()} rejected by {uuid.uuid4()}",
    "HTTP 422: ünïcödé — 数据 😀 rejected",
    "x" * 499 + "7" * 10,  # the digits past 500 characters do not count
    "0123456789" * 80,
    "regex specials .*+?^$()[]{}|\\ and a newline\nhere",
]


async def _insert(conn: asyncpg.Connection, error: str) -> uuid.UUID:
    message_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO dead_letters (durable, message_id, stream, original_subject, reason_code,"
        " last_error, record, dlq_subject, source, status) VALUES ($1, $2, 'S', 'x.y.v1',"
        " 'HANDLER_REJECTED', $3, '{}', 'sea.dlq', 'consumer', 'dead')",
        DURABLE, message_id, error,
    )  # fmt: skip
    return message_id


async def _fingerprints(conn: asyncpg.Connection, message_id: uuid.UUID) -> tuple[str, str]:
    row = await conn.fetchrow(
        f"SELECT fingerprint, {FINGERPRINT_SQL} AS computed FROM dead_letters"
        " WHERE message_id = $1",
        message_id,
    )
    assert row is not None
    return row["fingerprint"], row["computed"]


async def test_the_stored_fingerprint_is_the_pages_expression_and_follows_the_error(
    env: Env,
) -> None:
    conn = await asyncpg.connect(env.dsn("vibespro"))
    try:
        found = {}
        for error in ERRORS:
            message_id = await _insert(conn, error)
            stored, computed = await _fingerprints(conn, message_id)
            assert stored == computed and len(stored) == 12, error
            found[error] = stored
        assert found[ERRORS[1]] == found[ERRORS[2]], "numbers are blanked: one group"
        assert len(set(found.values())) == len(ERRORS) - 1
        # A new error on the same dead letter (a replay failed differently): a new group.
        await conn.execute(
            "UPDATE dead_letters SET last_error = 'schema: total missing' WHERE message_id = $1",
            message_id,
        )
        stored, computed = await _fingerprints(conn, message_id)
        assert stored == computed != found[ERRORS[-1]]
    finally:
        await conn.close()
