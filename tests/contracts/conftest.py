"""Fixtures of the port contract suites: every implementation of a port, one per parameter.

Each suite in this folder is written against a port of :mod:`shared.domain.ports` only;
the fixtures below hand it every implementation that must keep the contract: the real
backend (PostgreSQL, on the test's server) and the in-memory fake
(:mod:`shared.adapters.memory`). The suite itself does not know which it runs against
(Watermill's universal tests are the model). A case only a real database can honour is
marked with :func:`real_only`, with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import pytest

from shared.adapters.memory import MemoryConn, MemoryOutboxStore
from shared.adapters.memory_inbox import MemoryInboxStore
from shared.adapters.producer import record_event
from shared.adapters.stores import PostgresInboxStore, PostgresOutboxStore
from shared.domain.ports import InboxStore, OutboxStore
from tests.conftest import Env
from tests.helpers import insert_events

#: Every async wait of the suites is bounded by this (they cannot hang).
BOUND = 30.0

#: The backends of the store suites: the real one (servers started by the fixtures, hence
#: ``integration``) and the in-memory fake.
STORE_BACKENDS = [pytest.param("postgres", marks=pytest.mark.integration), "memory"]

Connect = Callable[[], Awaitable[Any]]


@dataclass
class StoreBackend:
    """A backend of the stores: its stores, its connections, and how to write outbox rows.

    ``insert_events(conn, count, aggregates=)`` commits ``count`` events spread over
    ``aggregates`` aggregates (their ids, in order); ``record(conn, aggregate)`` writes one
    event on ``conn`` (inside the caller's transaction, if any), the producer's way.
    """

    name: str
    connect: Connect
    outbox: OutboxStore[Any]
    inbox: InboxStore[Any]
    insert_events: Callable[..., Awaitable[list[str]]]
    record: Callable[[Any, str], Awaitable[str]]


F = TypeVar("F", bound=Callable[..., Any])


def real_only(reason: str) -> Callable[[F], F]:
    """Mark a case the in-memory fake cannot honour (``reason`` says why): its ``memory``
    instance is not collected (deselected, not skipped: nothing is missing from the run)."""

    def mark(case: F) -> F:
        case.real_only = reason  # type: ignore[attr-defined]
        return case

    return mark


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the ``memory`` instance of a :func:`real_only` case."""
    kept, left_out = [], []
    for item in items:
        reason = getattr(getattr(item, "function", None), "real_only", None)
        callspec = getattr(item, "callspec", None)
        memory = callspec is not None and callspec.params.get("store_backend") == "memory"
        (left_out if reason and memory else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


@pytest.fixture(params=STORE_BACKENDS)
def store_backend(request: pytest.FixtureRequest) -> StoreBackend:
    """The stores on the ``sea`` context's migrated database, or in memory."""
    if request.param == "memory":
        return _memory_backend()
    assert request.param == "postgres"
    # Asked for here only: the memory backend starts no server.
    backend: StoreBackend = request.getfixturevalue("postgres_backend")
    return backend


@pytest.fixture
async def postgres_backend(env: Env) -> AsyncIterator[StoreBackend]:
    """The PostgreSQL stores, on connections to the ``sea`` context's database."""
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncio.wait_for(asyncpg.connect(env.dsn("sea")), timeout=BOUND)
        opened.append(conn)
        return conn

    async def record(conn: asyncpg.Connection, aggregate: str) -> str:
        event_id = await record_event(
            conn,
            aggregate_type="model",
            aggregate_id=aggregate,
            event_type="model_published",
            payload={"model_id": aggregate, "name": aggregate, "n": 1},
        )
        return str(event_id)

    yield StoreBackend(
        "postgres",
        connect,
        PostgresOutboxStore(),
        PostgresInboxStore(),
        insert_events,
        record,
    )
    for conn in opened:
        await conn.close()


def _memory_backend() -> StoreBackend:
    outbox = MemoryOutboxStore()

    async def connect() -> MemoryConn:
        return MemoryConn()

    async def record(conn: MemoryConn, aggregate: str) -> str:
        payload = {"model_id": aggregate, "name": aggregate, "n": 1}
        event_id = await outbox.append(
            conn,
            aggregate_type="model",
            aggregate_id=aggregate,
            event_type="model_published",
            payload=json.dumps(payload),
        )
        return str(event_id)

    async def insert(conn: MemoryConn, count: int, *, aggregates: int = 10) -> list[str]:
        ids = []
        async with conn.transaction():
            for index in range(count):
                aggregate = f"m{index % aggregates}"
                payload = {"model_id": aggregate, "name": f"n{index}", "n": index}
                event_id = await outbox.append(
                    conn,
                    aggregate_type="model",
                    aggregate_id=aggregate,
                    event_type="model_published",
                    payload=json.dumps(payload),
                )
                ids.append(str(event_id))
        return ids

    return StoreBackend("memory", connect, outbox, MemoryInboxStore(), insert, record)


@pytest.fixture
def outbox_store(store_backend: StoreBackend) -> OutboxStore[Any]:
    return store_backend.outbox


@pytest.fixture
def inbox_store(store_backend: StoreBackend) -> InboxStore[Any]:
    return store_backend.inbox
