"""Helpers of the hardening tests: roles with test-sized clocks, stream outages, raw records."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from services.dlq_replayer.replayer import DlqReplayer
from services.dlq_router.router import ERRORS, DlqRouter
from services.dlq_router.sweep import Sweep
from shared.domain.envelope import Envelope
from tests.conftest import Env
from tests.consumer.conftest import DURABLE


def dsns(env: Env) -> dict[str, str]:
    return {env.topology.contexts[c].database: env.dsn(c) for c in env.topology.contexts}


async def rows(env: Env, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def dead_letter_rows(env: Env) -> list[asyncpg.Record]:
    return await rows(env, "SELECT * FROM dead_letters WHERE durable = $1", DURABLE)


async def status_of(env: Env, message_id: str) -> str | None:
    found = await rows(
        env,
        "SELECT status FROM dead_letters WHERE durable = $1 AND message_id = $2",
        DURABLE,
        uuid.UUID(message_id),
    )
    return found[0]["status"] if found else None


async def statuses_are(env: Env, message_ids: list[str], status: str) -> bool:
    return all([await status_of(env, m) == status for m in message_ids])


async def true(value: bool) -> bool:
    return value


async def raw_records(js: JetStreamContext, stream: str = "SEA_DLQ") -> list[bytes]:
    """Every message body of a dead-letter stream, as the bytes on the wire."""
    info = await js.stream_info(stream)
    out: list[bytes] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            out.append((await js.get_msg(stream, seq)).data or b"")
        except NotFoundError:
            continue
    return out


async def publish_utf8(nc: NATS, event: Envelope) -> None:
    """Publish ``event`` as UTF-8 JSON (its wire form once envelopes stop ASCII-escaping)."""
    body = json.dumps(event.to_dict(), ensure_ascii=False, separators=(",", ":")).encode()
    await nc.jetstream().publish(event.subject, body, headers={"Nats-Msg-Id": event.message_id})


@asynccontextmanager
async def subjects_removed(js: JetStreamContext, stream: str, prefix: str) -> AsyncIterator[None]:
    """The stream stops capturing the subjects starting with ``prefix`` (publishes there get
    no stream response, as while a stream has no leader), until the block ends."""
    info = await js.stream_info(stream)
    config = info.config
    original = list(config.subjects or [])
    kept = [s for s in original if not s.startswith(prefix)]
    assert kept != original, f"{stream} has no subject starting with {prefix}"
    config.subjects = kept or [f"unused.{stream.lower()}"]
    await js.update_stream(config)
    try:
        yield
    finally:
        config.subjects = original
        await js.update_stream(config)


class Roles:
    """An in-process dlq-router and/or dlq-replayer with test-sized clocks."""

    def __init__(self, env: Env, js: JetStreamContext) -> None:
        self.env, self.js = env, js
        self.pools: dict[str, asyncpg.Pool] = {}
        self.stops: list[asyncio.Event] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Roles:
        for database, dsn in dsns(self.env).items():
            self.pools[database] = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        return self

    def router(
        self, *, sweep_margin: float = 300.0, sweep_interval: float | None = None
    ) -> DlqRouter:
        router = DlqRouter(
            topology=self.env.topology, pools=self.pools, js=self.js, sweep_margin=sweep_margin
        )
        stop = asyncio.Event()
        self.stops.append(stop)
        self.tasks.append(
            asyncio.create_task(router.run(stop, fetch_timeout=0.2, sweep_interval=sweep_interval))
        )
        return router

    def sweep(self, *, margin: float, spent_after: float = 30.0) -> Sweep:
        """The router's sweep alone (no advisory routing), as one router replica runs it."""
        return Sweep(
            topology=self.env.topology,
            pools=self.pools,
            js=self.js,
            margin=margin,
            errors=ERRORS,
            spent_after=spent_after,
        )

    def replayer(self, *, unconfirmed_after: float = 1.0) -> DlqReplayer:
        replayer = DlqReplayer(
            topology=self.env.topology,
            pools=self.pools,
            js=self.js,
            unconfirmed_after=unconfirmed_after,
        )
        stop = asyncio.Event()
        self.stops.append(stop)
        self.tasks.append(asyncio.create_task(replayer.run(stop, interval=0.2)))
        return replayer

    def alive(self) -> bool:
        """Every role started is still running (none exited)."""
        return all(not t.done() for t in self.tasks)

    async def stop_all(self) -> None:
        for stop in self.stops:
            stop.set()
        for task in self.tasks:
            await asyncio.wait_for(task, timeout=20)
        self.tasks, self.stops = [], []

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop_all()
        finally:
            for pool in self.pools.values():
                await pool.close()
