"""Fixtures of the port contract suites: one implementation per parameter.

Each suite in this folder is written against a port of :mod:`shared.domain.ports` only;
the fixtures below hand it every implementation that must keep the contract. A second
backend (or an in-memory fake) joins by adding its name to ``params`` and a branch that
builds it — the suite itself does not change (Watermill's universal tests are the model).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import api as js_api

from shared.access.streams import provision
from shared.adapters.stores import (
    PostgresDeadLetterStore,
    PostgresInboxStore,
    PostgresOutboxStore,
)
from shared.adapters.transport import NatsTransport
from shared.domain.ports import DeadLetterStore, EventTransport, InboxStore, OutboxStore
from tests.conftest import CAPS, Env

pytestmark = pytest.mark.integration

#: Every async wait of the suites is bounded by this (they cannot hang).
BOUND = 30.0

Connect = Callable[[], Awaitable[asyncpg.Connection]]


@dataclass
class StoreBackend:
    """A store implementation and how to open connections to its database."""

    name: str
    connect: Connect
    env: Env


@pytest.fixture(params=["postgres"])
async def store_backend(request: pytest.FixtureRequest, env: Env) -> AsyncIterator[StoreBackend]:
    """The database the store suites run on (the ``sea`` context's, migrated)."""
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncio.wait_for(asyncpg.connect(env.dsn("sea")), timeout=BOUND)
        opened.append(conn)
        return conn

    assert request.param == "postgres"
    yield StoreBackend(request.param, connect, env)
    for conn in opened:
        await conn.close()


@pytest.fixture
def outbox_store(store_backend: StoreBackend) -> OutboxStore[Any]:
    return PostgresOutboxStore()


@pytest.fixture
def inbox_store(store_backend: StoreBackend) -> InboxStore[Any]:
    return PostgresInboxStore()


@pytest.fixture
async def dead_letter_store(store_backend: StoreBackend, nc: NATS) -> DeadLetterStore[Any, Any]:
    js = nc.jetstream()
    await asyncio.wait_for(provision(js, store_backend.env.topology, caps=CAPS), timeout=BOUND)
    return PostgresDeadLetterStore(js=js, topology=store_backend.env.topology)


@dataclass
class TransportBackend:
    """A transport, the stream subjects it carries, and how to add a durable to it."""

    transport: EventTransport
    subject_prefix: str
    add_durable: Callable[..., Awaitable[str]]


#: The contract stream: its subjects, its duplicate window.
CONTRACT_STREAM = "CONTRACT"
DUPLICATE_WINDOW = 60.0


@pytest.fixture(params=["nats"])
async def transport_backend(
    request: pytest.FixtureRequest, nc: NATS
) -> AsyncIterator[TransportBackend]:
    """A fresh stream ``contract.>`` on the test's nats-server, durables on demand."""
    assert request.param == "nats"
    js = nc.jetstream()
    await js.add_stream(
        name=CONTRACT_STREAM,
        subjects=["contract.>"],
        duplicate_window=DUPLICATE_WINDOW,
        storage=js_api.StorageType.FILE,
    )

    async def add_durable(*, ack_wait: float = 30.0) -> str:
        name = "d" + uuid.uuid4().hex[:8]
        await js.add_consumer(
            CONTRACT_STREAM,
            js_api.ConsumerConfig(
                durable_name=name,
                ack_policy=js_api.AckPolicy.EXPLICIT,
                ack_wait=ack_wait,
                max_deliver=10,
                deliver_policy=js_api.DeliverPolicy.ALL,
            ),
        )
        return name

    transport = NatsTransport(js, stream=CONTRACT_STREAM)
    yield TransportBackend(transport, "contract", add_durable)
    await transport.close()
