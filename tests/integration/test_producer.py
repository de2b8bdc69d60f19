"""REQ-050 / INV-022: state and event commit together or not at all; bad events are refused."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from shared.adapters.postgres import Statement
from shared.adapters.producer import record_event, record_event_with
from shared.domain.errors import OutboxValidationError

pytestmark = pytest.mark.integration


async def _make_state_table(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE TABLE models (id TEXT PRIMARY KEY, name TEXT NOT NULL)")


async def _counts(conn: asyncpg.Connection) -> tuple[int, int]:
    models = await conn.fetchval("SELECT count(*) FROM models")
    events = await conn.fetchval("SELECT count(*) FROM outbox_events")
    return models, events


async def test_commit_keeps_state_and_event(sea_conn: asyncpg.Connection) -> None:
    await _make_state_table(sea_conn)
    async with sea_conn.transaction():
        await sea_conn.execute("INSERT INTO models VALUES ('m1', 'first')")
        event_id = await record_event(
            sea_conn,
            aggregate_type="model",
            aggregate_id="m1",
            event_type="model_published",
            payload={"model_id": "m1", "name": "first"},
        )
    assert await _counts(sea_conn) == (1, 1)
    row = await sea_conn.fetchrow("SELECT * FROM outbox_events WHERE id = $1", event_id)
    assert row["published_at"] is None and row["publish_attempts"] == 0
    assert row["event_version"] == 1


async def test_rollback_leaves_neither(sea_conn: asyncpg.Connection) -> None:
    await _make_state_table(sea_conn)
    with pytest.raises(RuntimeError, match="domain failure"):
        async with sea_conn.transaction():
            await sea_conn.execute("INSERT INTO models VALUES ('m1', 'first')")
            await record_event(
                sea_conn,
                aggregate_type="model",
                aggregate_id="m1",
                event_type="model_published",
                payload={"model_id": "m1", "name": "first"},
            )
            raise RuntimeError("domain failure after the event was recorded")
    assert await _counts(sea_conn) == (0, 0)


async def test_a_refused_event_aborts_the_callers_transaction(sea_conn: asyncpg.Connection) -> None:
    await _make_state_table(sea_conn)
    with pytest.raises(OutboxValidationError):
        async with sea_conn.transaction():
            await sea_conn.execute("INSERT INTO models VALUES ('m1', 'first')")
            await record_event(
                sea_conn,
                aggregate_type="model",
                aggregate_id="m1",
                event_type="ModelPublished",
                payload={},
            )
    assert await _counts(sea_conn) == (0, 0)


async def test_outside_a_transaction_is_refused(sea_conn: asyncpg.Connection) -> None:
    with pytest.raises(OutboxValidationError, match="inside the caller's transaction"):
        await record_event(
            sea_conn,
            aggregate_type="model",
            aggregate_id="m1",
            event_type="model_published",
            payload={},
        )
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 0


@pytest.mark.parametrize(
    ("kwargs", "code", "field"),
    [
        ({"event_type": ""}, "INVALID_OUTBOX", "event_type"),
        ({"event_type": None}, "INVALID_OUTBOX", "event_type"),
        ({"event_type": "Model-Published"}, "INVALID_SUBJECT", "event_type"),
        ({"event_version": 0}, "INVALID_SUBJECT", "event_version"),
        ({"event_id": "not-a-uuid"}, "INVALID_OUTBOX", "event_id"),
        ({"aggregate_id": ""}, "INVALID_OUTBOX", "aggregate_id"),
        ({"payload": ["not", "an", "object"]}, "INVALID_OUTBOX", "payload"),
        ({"payload": {"x": float("nan")}}, "INVALID_OUTBOX", "payload"),
        # A day ahead: the value is computed at collection, minutes before a slow run gets here.
        ({"occurred_at": datetime.now(UTC) + timedelta(days=1)}, "FUTURE_EVENT", "occurred_at"),
        ({"occurred_at": datetime(2025, 1, 1)}, "INVALID_OUTBOX", "occurred_at"),
    ],
)
async def test_policy_violations_are_named(
    sea_conn: asyncpg.Connection, kwargs: dict[str, object], code: str, field: str
) -> None:
    args: dict[str, object] = {
        "aggregate_type": "model",
        "aggregate_id": "m1",
        "event_type": "model_published",
        # Valid for the schema, so each case fails on its own violation only.
        "payload": {"model_id": "m1", "name": "m"},
    }
    args.update(kwargs)
    with pytest.raises(OutboxValidationError) as caught:
        async with sea_conn.transaction():
            await record_event(sea_conn, **args)  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.field) == (code, field)
    assert field in str(caught.value)
    assert await sea_conn.fetchval("SELECT count(*) FROM outbox_events") == 0


async def test_raw_sql_insert_with_only_sds_columns(sea_conn: asyncpg.Connection) -> None:
    """A producer in another language inserts exactly SDS-047 §9's columns."""
    event_id = uuid.uuid4()
    await sea_conn.execute(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload)"
        " VALUES ($1, 'model', 'm9', 'model_published', '{\"model_id\": \"m9\"}')",
        event_id,
    )
    row = await sea_conn.fetchrow("SELECT * FROM outbox_events WHERE id = $1", event_id)
    assert row["event_version"] == 1 and row["occurred_at"] is not None and row["txid"] is not None


@pytest.mark.parametrize(
    ("column_sql", "constraint"),
    [
        ("'Model Published', '{}', now()", "chk_event_type_snake_case"),
        ("'model_published', '[]', now()", "chk_payload_object"),
        ("'model_published', '{}', now() + interval '1 hour'", "chk_occurred_not_future"),
    ],
)
async def test_raw_sql_path_enforces_the_same_rules(
    sea_conn: asyncpg.Connection, column_sql: str, constraint: str
) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match=constraint):
        await sea_conn.execute(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload,"
            f" occurred_at) VALUES (gen_random_uuid(), 'model', 'm1', {column_sql})"
        )
    with pytest.raises(asyncpg.NotNullViolationError):
        await sea_conn.execute(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, payload)"
            " VALUES (gen_random_uuid(), 'model', 'm1', '{}')"
        )


# --- the one-statement form: state change and event as one statement ------------------

MODEL = {"aggregate_type": "model", "aggregate_id": "m1", "event_type": "model_published"}


def _insert_model(name: str) -> Statement:
    return Statement("INSERT INTO models VALUES ($1, $2)", ("m1", name))


async def test_one_statement_keeps_state_and_event(sea_conn: asyncpg.Connection) -> None:
    await _make_state_table(sea_conn)
    event_id = await record_event_with(
        sea_conn, _insert_model("first"), **MODEL, payload={"model_id": "m1", "name": "first"}
    )
    assert await _counts(sea_conn) == (1, 1)
    row = await sea_conn.fetchrow("SELECT * FROM outbox_events WHERE id = $1", event_id)
    assert json.loads(row["payload"]) == {"model_id": "m1", "name": "first"}
    assert row["published_at"] is None and row["occurred_at"] is not None


async def test_one_statement_whose_change_fails_writes_no_event(
    sea_conn: asyncpg.Connection,
) -> None:
    await _make_state_table(sea_conn)
    payload = {"model_id": "m1", "name": "first"}
    await record_event_with(sea_conn, _insert_model("first"), **MODEL, payload=payload)
    with pytest.raises(asyncpg.UniqueViolationError):
        await record_event_with(sea_conn, _insert_model("again"), **MODEL, payload=payload)
    assert await _counts(sea_conn) == (1, 1)


async def test_one_statement_in_a_rolled_back_transaction_leaves_neither(
    sea_conn: asyncpg.Connection,
) -> None:
    await _make_state_table(sea_conn)
    with pytest.raises(RuntimeError, match="domain failure"):
        async with sea_conn.transaction():
            await record_event_with(
                sea_conn, _insert_model("x"), **MODEL, payload={"model_id": "m1", "name": "x"}
            )
            raise RuntimeError("domain failure after the event was recorded")
    assert await _counts(sea_conn) == (0, 0)


async def test_one_statement_keeps_the_changes_own_with_clause(
    sea_conn: asyncpg.Connection,
) -> None:
    await _make_state_table(sea_conn)
    change = Statement(
        "WITH n AS (SELECT $1::text AS id, upper($2::text) AS name)"
        " INSERT INTO models SELECT id, name FROM n",
        ("m1", "shout"),
    )
    occurred = datetime.now(UTC) - timedelta(seconds=5)
    await record_event_with(
        sea_conn, change, **MODEL, payload={"model_id": "m1", "name": "shout"},
        occurred_at=occurred,
    )  # fmt: skip
    assert await sea_conn.fetchval("SELECT name FROM models") == "SHOUT"
    assert await sea_conn.fetchval("SELECT occurred_at FROM outbox_events") == occurred


async def test_one_statement_refuses_a_bad_event_before_writing(
    sea_conn: asyncpg.Connection,
) -> None:
    await _make_state_table(sea_conn)
    with pytest.raises(OutboxValidationError) as refused:
        await record_event_with(
            sea_conn, _insert_model("first"), **MODEL, payload={"model_id": "m1"}
        )
    assert refused.value.code == "SCHEMA_INVALID" and refused.value.field == "payload"
    assert await _counts(sea_conn) == (0, 0)
