"""Test helpers: bounded waits, reading a stream back, running a publisher in-process."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from services.dlq_replayer.replayer import DlqReplayer
from services.dlq_router.router import DlqRouter
from services.outbox_publisher.publisher import OutboxPublisher, ordering_fields_of
from services.outbox_publisher.watch import OutboxWatch
from shared.adapters.notify import listen
from shared.adapters.producer import record_event
from shared.contracts.topology import Topology


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass(frozen=True)
class StreamMsg:
    """One message read back from a stream."""

    seq: int
    subject: str
    msg_id: str
    headers: dict[str, str]
    body: dict[str, Any]


async def stream_messages(js: JetStreamContext, stream: str) -> list[StreamMsg]:
    """Every message currently in ``stream``, in stream order (independent of any consumer)."""
    info = await js.stream_info(stream)
    out: list[StreamMsg] = []
    if not info.state.messages:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            raw = await js.get_msg(stream, seq)
        except NotFoundError:
            continue
        headers = dict(raw.headers or {})
        out.append(
            StreamMsg(
                seq,
                raw.subject or "",
                headers.get("Nats-Msg-Id", ""),
                headers,
                json.loads(raw.data or b"{}"),
            )
        )
    return out


async def stream_count(js: JetStreamContext, stream: str) -> int:
    """Number of messages in ``stream``."""
    return int((await js.stream_info(stream)).state.messages)


async def insert_events(
    conn: asyncpg.Connection,
    count: int,
    *,
    aggregates: int = 10,
    event_type: str = "model_published",
) -> list[str]:
    """Commit ``count`` events spread over ``aggregates`` aggregates; return their ids in order."""
    ids = []
    async with conn.transaction():
        for index in range(count):
            event_id = await record_event(
                conn,
                aggregate_type="model",
                aggregate_id=f"m{index % aggregates}",
                event_type=event_type,
                payload={"model_id": f"m{index % aggregates}", "name": f"n{index}", "n": index},
            )
            ids.append(str(event_id))
    return ids


class RunningPublisher:
    """An in-process outbox-publisher (the same class the role runs), for tests."""

    def __init__(
        self,
        topology: Topology,
        context: str,
        dsn: str,
        js: JetStreamContext,
        *,
        batch_size: int = 100,
        concurrency: int = 2,
        poll_interval: float = 0.5,
        atomic_batches: bool = True,
        atomic_min_rows: int | None = None,
        watch_period: float | None = None,
    ) -> None:
        """``watch_period``: run the outbox watch with that period (None: no watch)."""
        self.topology, self.context, self.dsn, self.js = topology, context, dsn, js
        self.watch_period = watch_period
        self.atomic_batches, self.atomic_min_rows = atomic_batches, atomic_min_rows
        self.batch_size, self.concurrency = batch_size, concurrency
        self.poll_interval = poll_interval
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> OutboxPublisher:
        ctx = self.topology.contexts[self.context]
        assert ctx.stream is not None
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.concurrency + 1)
        publisher = OutboxPublisher(
            pool=self.pool,
            js=self.js,
            context=self.context,
            namespace=ctx.namespace,
            stream=ctx.stream.name,
            batch_size=self.batch_size,
            publish_timeout=2.0,
            retry_initial=0.05,
            retry_max=0.5,
            partitions=ctx.stream.partitions,
            ordering_fields=ordering_fields_of(self.topology, self.context),
            atomic_batches=self.atomic_batches,
        )
        if self.atomic_min_rows is not None:
            publisher.atomic_min_rows = self.atomic_min_rows
        if self.watch_period is not None:
            publisher.watch = OutboxWatch(
                self.pool, publisher, period=self.watch_period, poll_interval=self.poll_interval
            )
            self.tasks.append(asyncio.create_task(publisher.watch.run(self.stop)))
        self.tasks.append(
            asyncio.create_task(listen(self.dsn, "ferry_outbox", publisher.notify, self.stop))
        )
        for _ in range(self.concurrency):
            self.tasks.append(
                asyncio.create_task(
                    publisher.run_worker(self.stop, poll_interval=self.poll_interval)
                )
            )
        return publisher

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), timeout=15)
        await self.pool.close()


class _TopologyRole:
    """Pools per target database, for an in-process dlq-router or dlq-replayer."""

    def __init__(self, topology: Topology, dsns: dict[str, str], js: JetStreamContext) -> None:
        self.topology, self.dsns, self.js = topology, dsns, js
        self.stop = asyncio.Event()
        self.pools: dict[str, asyncpg.Pool] = {}
        self.task: asyncio.Task[None] | None = None

    async def _open(self) -> None:
        for database, dsn in self.dsns.items():
            self.pools[database] = await asyncpg.create_pool(dsn, min_size=1, max_size=3)

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, timeout=20)
        for pool in self.pools.values():
            await pool.close()


class RunningRouter(_TopologyRole):
    """The dlq-router's class, in-process. ``dsns`` maps database name → DSN."""

    async def __aenter__(self) -> DlqRouter:
        await self._open()
        router = DlqRouter(topology=self.topology, pools=self.pools, js=self.js)
        self.task = asyncio.create_task(router.run(self.stop, fetch_timeout=0.2))
        return router


class RunningReplayer(_TopologyRole):
    """The dlq-replayer's class, in-process."""

    async def __aenter__(self) -> DlqReplayer:
        await self._open()
        replayer = DlqReplayer(topology=self.topology, pools=self.pools, js=self.js)
        self.task = asyncio.create_task(replayer.run(self.stop, interval=0.2))
        return replayer
