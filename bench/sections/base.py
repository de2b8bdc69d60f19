"""Shared by every section: the run's options and state, and the helpers that fill an
outbox, count what was processed and book rows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from bench.common import AGGREGATES, say
from bench.report import Results, Row
from bench.world import (
    Deployment,
    Servers,
    TlsHops,
    traces_ratio,
)

SEA_DURABLE = "vibespro__from_sea"
SEA_STREAM = "SEA_EVENTS"
#: A step is sustained when the producer kept ≥ 97 % of the offered rate, every event
#: was processed within the grace after the producer stopped, and p99 ≤ 500 ms
#: (the seed's KPI: a backlog that grows during the step shows up as a growing p99).
SUSTAIN_ACHIEVED = 0.97
SUSTAIN_P99_MS = 500.0
#: Longest time without progress before a wait gives up.
STALL_SECONDS = 60.0


@dataclass
class Options:
    """What to measure and how big (see ``python -m bench --help``)."""

    rows: int
    peer_rows: int
    seconds: float
    rates: list[int]
    mediation_rate: int
    sustain_start: int
    sustain_step: int
    sustain_max: int
    soak_seconds: float
    soak_rate: int
    warmup_seconds: float
    modes: list[str]
    sections: set[str]
    peer_workers: int = 32
    drain_budget: float = 600.0
    producer_connections: int = 16
    producer_form: str = "transaction"
    baseline_seconds: float = 10.0
    statements: bool = False
    #: Settings given to every role (``--set FERRY_NAME=VALUE``), for experiments.
    role_settings: dict[str, str] = field(default_factory=dict)
    #: The ordered drain: partitions of its stream and consumer replicas.
    ordered_partitions: int = 4
    ordered_replicas: int = 2
    #: The batch-call drain: events per handler call (``handler.batch``).
    handler_batch: int = 50
    #: With both tracing modes, runs of the one-consumer drain in each (pairs, order
    #: alternating); its figures are all events over all their time.
    drain_pairs: int = 2
    #: The TLS section (issue 47): the offered load of its latency step, and the pairs
    #: of its one-consumer drain (TLS off and on, order alternating).
    tls_rate: int = 600
    tls_pairs: int = 2
    #: The volume section (issue 48): the issue's year of history times this.
    volume_scale: float = 1.0
    #: The retention soak (issue 48): what every table keeps, in seconds.
    soak_retention: float = 120.0


@dataclass
class Bench:
    """One run: the servers, the options, the results being filled in."""

    servers: Servers
    options: Options
    results: Results
    logs: Any
    tracing_available: dict[str, bool] = field(default_factory=dict)

    def deployment(
        self, topology: str, mode: str, label: str,
        patch: Callable[[dict[str, Any]], None] | None = None, tls: TlsHops | None = None,
    ) -> Deployment:  # fmt: skip
        return Deployment(
            self.servers, topology, mode == "on", self.logs, label,
            role_settings=dict(self.options.role_settings), patch=patch, tls=tls,
        )  # fmt: skip


async def wait_for(
    what: str, count: Callable[[], Awaitable[int]], target: int, budget: float | None = None
) -> int:
    """Poll ``count`` until it reaches ``target``; progress every 5 s; fail on a stall.

    With a ``budget`` (seconds), give up waiting once it is spent and return the count
    reached: the caller reports a partial figure instead of blocking the run for hours.
    """
    started = last_report = last_change = time.monotonic()
    last = -1
    while True:
        now_count = await count()
        now = time.monotonic()
        if now_count != last:
            last, last_change = now_count, now
        if now_count >= target or (budget is not None and now - started > budget):
            return now_count
        if now - last_report >= 5:
            rate = now_count / (now - started)
            say(f"    {what}: {now_count:,}/{target:,} ({rate:,.0f}/s)")
            last_report = now
        if now - last_change > STALL_SECONDS:
            stuck = f"{what}: stuck at {now_count:,}/{target:,} for {STALL_SECONDS:.0f}s"
            raise TimeoutError(stuck)
        await asyncio.sleep(0.2)


async def fill_outbox(
    conn: asyncpg.Connection,
    rows: int,
    event_type: str = "model_published",
    *,
    traced: bool = False,
    scattered: bool = False,
) -> None:
    """INSERT ``rows`` events into the outbox in one statement (the caller's transaction).

    ``traced``: each row carries the traceparent a traced producer's ``create`` span
    would have stored — a trace of its own, sampled at the bench's ratio — so a
    tracing-on drain pays what it pays in production. Without it every row is
    untraced, and the publisher would start (and sample) each trace itself.

    The events' aggregates (their ordering keys) are :data:`AGGREGATES` models: row ``g``
    is model ``g % AGGREGATES`` (each key's events 1,000 rows apart, never two in one
    batch), or with ``scattered`` model ``hash(g) % AGGREGATES`` — a fixed pseudo-random
    spread in which a key's events often share a batch or are in flight together, as
    they do in an application, so per-key order is really put to the test.
    """
    if event_type != "model_published":
        raise ValueError(f"no backlog payload for {event_type!r}")
    await conn.execute(
        "INSERT INTO outbox_events"
        " (id, aggregate_type, aggregate_id, event_type, payload, traceparent)"
        " SELECT gen_random_uuid(), 'model', k.model, 'model_published',"
        " jsonb_build_object('model_id', k.model, 'name', 'bench model ' || g),"
        " CASE WHEN $3 THEN '00-' || md5(g || ':' || random()) || '-'"
        "   || left(md5(random()::text), 16) || CASE WHEN random() < $4 THEN '-01' ELSE '-00' END"
        " END"
        " FROM generate_series(1, $1) g,"
        " LATERAL (SELECT 'm' || CASE WHEN $5 THEN (hashint4(g)::bigint & 2147483647) % $2"
        "   ELSE g % $2 END AS model) k"
        " ORDER BY g",
        rows,
        AGGREGATES,
        traced,
        float(traces_ratio()),
        scattered,
    )


async def processed(conn: asyncpg.Connection, durable: str, since: datetime | None = None) -> int:
    """Rows of ``durable`` processed (optionally: of events that occurred since ``since``)."""
    if since is None:
        query = "SELECT count(*) FROM inbox_messages WHERE durable = $1 AND status = 'processed'"
        return int(await conn.fetchval(query, durable))
    query = (
        "SELECT count(*) FROM inbox_messages WHERE durable = $1 AND status = 'processed'"
        " AND occurred_at >= $2"
    )
    return int(await conn.fetchval(query, durable, since))


async def handler_books(conn: asyncpg.Connection, handler: str) -> dict[str, int]:
    """The handler's own record: calls made, ids applied, and dead-lettered inbox rows."""
    calls = await conn.fetchval("SELECT count(*) FROM handler_calls WHERE handler = $1", handler)
    applied = await conn.fetchval(
        "SELECT count(*) FROM handler_applied WHERE handler = $1", handler
    )
    failed = await conn.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'failed'")
    # Race-free even while calls are in flight: an id called twice is a second call.
    twice = await conn.fetchval(
        "SELECT count(*) FROM (SELECT message_id FROM handler_calls WHERE handler = $1"
        " GROUP BY message_id HAVING count(*) > 1) t", handler,
    )  # fmt: skip
    return {"handler_calls": int(calls), "handler_applied": int(applied),
            "dead_lettered": int(failed), "ids_called_twice": int(twice)}  # fmt: skip


async def sink_spans(bench: Bench) -> int:
    return int((await bench.servers.sink_stats())["spans"])


def ferry_row(bench: Bench, key: str, label: str, unit: str, **kwargs: Any) -> Row:
    return bench.results.row(key, label, unit, **kwargs)


def note_spans(bench: Bench, mode: str, spans: int) -> None:
    if mode == "on":
        seen = bench.tracing_available.get("on", False)
        bench.tracing_available["on"] = seen or spans > 0
