"""The measurements, one coroutine per section of the table.

Every Ferry measurement runs the roles as processes on a fresh :class:`Deployment`;
every count that decides a figure is read back from the databases or the stream, not
from what the bench believes it sent.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import nats

from bench import ratios, search
from bench.common import AGGREGATES, say, stream_span, summarize
from bench.ratios import BATCH_TARGET
from bench.report import Results, Row, Target
from bench.world import (
    PYTHON,
    Deployment,
    Servers,
    batch_delta,
    cpu_delta,
    run_worker,
    spawn,
    traces_ratio,
)
from devstack.ports import free_port
from shared.waits import sleep_unless

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
        patch: Callable[[dict[str, Any]], None] | None = None,
    ) -> Deployment:  # fmt: skip
        return Deployment(
            self.servers, topology, mode == "on", self.logs, label,
            role_settings=dict(self.options.role_settings), patch=patch,
        )  # fmt: skip


# ----------------------------------------------------------------------------- helpers


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


# ---------------------------------------------------------------------------- baselines


async def baselines(bench: Bench) -> None:
    """Raw JetStream publish and consume, the PostgreSQL transaction, the HTTP round trip."""
    opts, res = bench.options, bench.results
    say(f"baselines: JetStream publish/consume of {opts.rows:,}, PostgreSQL and HTTP for "
        f"{opts.baseline_seconds:.0f}s each")  # fmt: skip
    details: dict[str, Any] = {}
    async with bench.deployment("sea-vibespro", "off", "baseline") as dep:
        url = bench.servers.nats.url
        jobs: list[tuple[str, list[str]]] = [
            ("js-publish", ["--nats-url", url, "--rows", str(opts.rows)]),
            ("js-consume", ["--nats-url", url, "--rows", str(opts.rows)]),
            ("pg-txn", ["--dsn", dep.dsn("sea"), "--seconds", str(opts.baseline_seconds)]),
        ]
        for kind, args in jobs:
            details[kind] = await _baseline(bench, kind, args)
        handler_url = await dep.start_handler("vibespro")
        args = ["--url", handler_url, "--seconds", str(opts.baseline_seconds)]
        details["http-handler"] = await _baseline(bench, "http-handler", args)
        echo_args = ["--seconds", str(opts.baseline_seconds)]
        details["http-echo"] = await _baseline(bench, "http-echo", echo_args)
    res.sections["baselines"] = details
    rows = [
        ("raw.js_publish", "raw JetStream publish, pipelined, unique Nats-Msg-Id", "msg/s",
         details["js-publish"]["msg_s"]),
        ("raw.js_consume", "raw JetStream pull consume + ack (batch 50)", "msg/s",
         details["js-consume"]["msg_s"]),
        ("raw.pg_txn", "raw PostgreSQL state+outbox transaction, 8 connections", "txn/s",
         details["pg-txn"]["txn_s"]),
        ("raw.http", "raw HTTP POST /handle to the example handler, 64 in flight", "req/s",
         details["http-handler"]["req_s"]),
        ("raw.http_echo", "raw HTTP POST round trip to a bare aiohttp server, 64 in flight",
         "req/s", details["http-echo"]["req_s"]),
    ]  # fmt: skip
    for key, label, unit, value in rows:
        res.row(key, label, unit).set("raw", value)


#: The baselines measured again at the run's end (``baselines again``): the raw POST
#: /handle every drain ratio divides by, and the state+outbox transaction behind every
#: producer. Key of the row at the end, key of the same measurement at the start.
AGAIN = (("raw.pg_txn_end", "raw.pg_txn", "pg-txn", "txn_s"),
         ("raw.http_end", "raw.http", "http-handler", "req_s"))  # fmt: skip


async def baselines_again(bench: Bench) -> None:
    """Two baselines measured again after every other section, beside their first figures.

    The VM's speed drifts over a 30-minute run (other tenants): the same measurement at
    both ends says how far a late section may be off from a baseline taken first, so a
    reader knows how much of a ratio is the machine. Each row's ratio is end ÷ start.
    """
    opts, res = bench.options, bench.results
    say(f"baselines again at the run's end: PostgreSQL and HTTP for "
        f"{opts.baseline_seconds:.0f}s each")  # fmt: skip
    details: dict[str, Any] = {}
    async with bench.deployment("sea-vibespro", "off", "baseline-end") as dep:
        seconds = ["--seconds", str(opts.baseline_seconds)]
        details["pg-txn"] = await _baseline(
            bench, "pg-txn", ["--dsn", dep.dsn("sea"), *seconds], label="raw pg-txn, end"
        )
        handler_url = await dep.start_handler("vibespro")
        details["http-handler"] = await _baseline(
            bench, "http-handler", ["--url", handler_url, *seconds], label="raw http-handler, end"
        )
    res.sections["baselines_end"] = details
    drift: dict[str, float] = {}
    for key, start_key, kind, field_name in AGAIN:
        start = next((r for r in res.rows if r.key == start_key), None)
        label = f"{start.label if start else kind}, measured again at the run's end"
        row = res.row(key, label, start.unit if start else "/s")
        row.set("raw", float(details[kind][field_name]))
        first = start.values.get("raw") if start else None
        if first:
            row.baseline, row.baseline_label = first, "the same measurement at the run's start"
            drift[start_key] = round(float(details[kind][field_name]) / first - 1, 3)
            row.notes.append(f"end ÷ start {details[kind][field_name] / first:.2f}: the "
                             f"machine's drift over the run")  # fmt: skip
    res.meta["baseline_drift"] = drift
    if drift:
        say("  drift over the run: " + ", ".join(
            f"{k} {100 * v:+.0f} %" for k, v in drift.items()))  # fmt: skip


async def _baseline(
    bench: Bench, kind: str, args: list[str], *, label: str | None = None
) -> dict[str, Any]:
    """Run one raw baseline worker; its CPU is booked as ``label`` (``raw <kind>``)."""
    book = bench.servers.book
    before = book.snapshot()
    started = time.monotonic()
    result = await run_worker(kind, [PYTHON, "-m", "bench.baselines", kind, *args],
                              bench_env())  # fmt: skip
    elapsed = time.monotonic() - started
    cpu = cpu_delta(before, book.snapshot())
    cpu["raw client"] = float(result.get("cpu_s", 0.0))
    count = int(result.get("count", 0))
    bench.results.book_cpu(label or f"raw {kind}", "raw", count, min(elapsed, result["seconds"]),
                           cpu)  # fmt: skip
    result["cpu_s_by_process"] = cpu
    rate = result.get("msg_s") or result.get("txn_s") or result.get("req_s")
    say(f"  {kind}: {rate:,.0f}/s")
    return result


def bench_env() -> dict[str, str]:
    from bench.world import clean_environ

    return clean_environ()


# ------------------------------------------------------------------------ drains


async def publisher_drain(bench: Bench, mode: str) -> None:
    """outbox-publisher emptying a backlog of ``rows`` events into its stream."""
    rows = bench.options.rows
    say(f"publisher drain of {rows:,} rows, tracing {mode}")
    row = ferry_row(bench, "ferry.publisher_drain", f"outbox-publisher drain, {rows:,}-row backlog",
                    "msg/s", target=ratios.PUBLISHER_TARGET)  # fmt: skip
    async with bench.deployment("sea-vibespro", mode, f"pubdrain-{mode}") as dep:
        await dep.start_publisher("sea")
        spans0 = await sink_spans(bench)
        nc = await nats.connect(bench.servers.nats.url)
        js = nc.jetstream()
        conn = await asyncpg.connect(dep.dsn("sea"))
        try:
            statements0 = await bench.servers.statement_counts()
            batches0 = await dep.batch_counts()
            before, started = await _commit_backlog(bench, conn, rows, mode)
            budget = bench.options.drain_budget
            await wait_for("published", lambda: _stream_count(js, SEA_STREAM), rows, budget)
            cpu = cpu_delta(before, bench.servers.book.snapshot())
            statements = statement_delta(statements0, await bench.servers.statement_counts())
            batches = await batches_since(dep, batches0)
            first, last, count = await stream_span(js, SEA_STREAM)
            pending = await conn.fetchval(
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
            )
        finally:
            await conn.close()
            await nc.close()
        spans = await sink_spans(bench) - spans0
    rate = count / max(last - first, 1e-3)
    elapsed = time.monotonic() - started
    bench.results.book_cpu(f"publisher drain {rows:,}", mode, count, elapsed, cpu)
    bench.results.book_statements(f"publisher drain {rows:,}", mode, count, statements)
    bench.results.sections.setdefault("publisher_drain", {})[mode] = {
        "rows": rows, "in_stream": count, "unpublished_left": int(pending), "msg_s": rate,
        "seconds": last - first, "spans_exported": spans, "cpu_s": cpu, "batches": batches,
    }  # fmt: skip
    row.set(mode, rate)
    form = _publish_form(bench)
    if form not in row.notes:
        row.notes.append(form)
    if count < rows:
        row.notes.append(f"tracing {mode}: partial, {count:,} of {rows:,} published when the "
                         f"--drain-budget ran out")  # fmt: skip
    _note_spans(bench, mode, spans)
    say(f"  publisher drain, tracing {mode}: {rate:,.0f} msg/s ({count:,} in stream)")


def _publish_form(bench: Bench) -> str:
    """How the publisher sends (the raw baseline stores one message per write)."""
    setting = bench.options.role_settings.get("FERRY_ATOMIC_BATCHES", "true").strip().lower()
    if setting in {"0", "false", "no", "off"}:
        return (
            "publisher sends one message per write, like the raw baseline "
            "(FERRY_ATOMIC_BATCHES=false)"
        )
    return (
        "publisher sends each claim as JetStream atomic batches (FERRY_ATOMIC_BATCHES, the "
        "default: one stored write per batch); the raw baseline stores one message per write"
    )


async def _commit_backlog(
    bench: Bench, conn: asyncpg.Connection, rows: int, mode: str, *, scattered: bool = False
) -> tuple[dict[str, float], float]:
    """Insert the backlog in one transaction; the CPU book opens just before its commit."""
    async with conn.transaction():
        await fill_outbox(conn, rows, traced=mode == "on", scattered=scattered)
        before = bench.servers.book.snapshot()
        started = time.monotonic()
    return before, started


async def _stream_count(js: Any, stream: str) -> int:
    return int((await js.stream_info(stream)).state.messages)


async def e2e_drain(bench: Bench, mode: str, replicas: int) -> None:
    """A backlog through publisher, stream, consumer(s), inbox and the example handler."""
    await _e2e_drain(bench, mode, replicas, ordered=False)


async def ordered_drain(bench: Bench, mode: str) -> None:
    """The same backlog and handler as :func:`e2e_drain`, the durable ``ordering: key`` on a
    stream of ``--ordered-partitions`` partitions, consumed by ``--ordered-replicas``
    consumer processes; every key's events must reach the handler in publish order."""
    await _e2e_drain(bench, mode, bench.options.ordered_replicas, ordered=True)


async def batch_drain(bench: Bench, mode: str) -> None:
    """The same backlog and handler as :func:`e2e_drain`, one consumer, the durable making
    batch handler calls (``handler.batch``: ``--handler-batch`` events per POST; the
    example handler applies each batch in one transaction)."""
    await _e2e_drain(bench, mode, 1, ordered=False, batched=bench.options.handler_batch)


def _batch_topology(size: int) -> Callable[[dict[str, Any]], None]:
    """The change that makes the sea→vibespro durable call its handler ``size`` at a time."""

    def patch(doc: dict[str, Any]) -> None:
        doc["durables"][SEA_DURABLE]["handler"]["batch"] = size

    return patch


def _ordered_topology(partitions: int) -> Callable[[dict[str, Any]], None]:
    """The change that makes the sea→vibespro lane ordered: SEA_EVENTS with ``partitions``
    partitions (its subjects ``sea.event.>`` capture the token) and the durable
    ``ordering: key`` (key: the aggregate; a dead letter holds its key)."""

    def patch(doc: dict[str, Any]) -> None:
        doc["contexts"]["sea"]["stream"]["partitions"] = partitions
        durable = doc["durables"][SEA_DURABLE]
        durable["ordering"] = "key"
        durable["on_dead_letter"] = "hold"
        durable["handler"]["batch"] = 1  # compared with the per-message unordered drains

    return patch


@dataclass
class _DrainKind:
    """What tells the drains apart: their row, their section, their topology."""

    label: str
    key: str
    section: str
    tag: str
    target: Target | None = None
    patch: Callable[[dict[str, Any]], None] | None = None


def _drain_kind(
    bench: Bench, mode: str, replicas: int, ordered: bool, batched: int = 0
) -> _DrainKind:
    rows = bench.options.rows
    many = "s" if replicas > 1 else ""
    if batched:
        say(f"end-to-end drain of {rows:,} events, {replicas} consumer replica{many}, batch "
            f"handler calls of up to {batched}, tracing {mode}")  # fmt: skip
        return _DrainKind(
            f"end-to-end backlog drain, {rows:,} events, {replicas} consumer{many}, batch "
            f"calls of {batched} (÷ raw POST /handle)",
            "ferry.e2e_drain_batch", "e2e_drain_batch", f"batch{replicas}", BATCH_TARGET,
            patch=_batch_topology(batched),
        )  # fmt: skip
    if not ordered:
        say(f"end-to-end drain of {rows:,} events, {replicas} consumer replica{many}, "
            f"tracing {mode}")  # fmt: skip
        # Issue 29: one consumer making one call per event, over the raw POST /handle.
        target = ratios.DRAIN_TARGET if replicas == 1 else None
        calls = ", per-message calls (÷ raw POST /handle)" if replicas == 1 else ""
        return _DrainKind(
            f"end-to-end backlog drain, {rows:,} events, {replicas} consumer{many}{calls}",
            f"ferry.e2e_drain_{replicas}", f"e2e_drain_{replicas}", f"drain{replicas}", target,
            patch=_batch_topology(1),  # per-message calls, whatever the topology ships
        )  # fmt: skip
    partitions = bench.options.ordered_partitions
    say(f"end-to-end ORDERED drain of {rows:,} events over {AGGREGATES:,} keys, "
        f"{partitions} partition(s), {replicas} consumer replica{many}, "
        f"tracing {mode}")  # fmt: skip
    return _DrainKind(
        f"end-to-end ordered drain, {rows:,} events, {AGGREGATES:,} keys, "
        f"{partitions} partition{'s' if partitions > 1 else ''}, {replicas} consumer{many}",
        "ferry.e2e_drain_ordered", "e2e_drain_ordered", f"ordered{replicas}",
        patch=_ordered_topology(partitions),
    )  # fmt: skip


async def _e2e_drain(
    bench: Bench, mode: str, replicas: int, *, ordered: bool, batched: int = 0
) -> None:
    rows, budget = bench.options.rows, bench.options.drain_budget
    kind = _drain_kind(bench, mode, replicas, ordered, batched)
    label = kind.label
    row = ferry_row(bench, kind.key, label, "msg/s", target=kind.target)
    if ordered:  # its rows under it; the ratio is filled in once every drain has run
        ordered_ratio_row(bench.results, replicas)
        ferry_row(bench, "ferry.order_violations",
                  "per-key order violations seen by the handler, ordered drain", "events",
                  target=Target("<=", 0, "= 0"))  # fmt: skip
    async with bench.deployment("sea-vibespro", mode, f"{kind.tag}-{mode}", kind.patch) as dep:
        names = [plan.name for plan in dep.topology.consumers(SEA_DURABLE)]
        handler_url = await dep.start_handler("vibespro")
        for replica in range(1, replicas + 1):
            await dep.start_consumer(SEA_DURABLE, handler_url, replica)
        nc = await nats.connect(bench.servers.nats.url)
        sea = await asyncpg.connect(dep.dsn("sea"))
        target_db = await asyncpg.connect(dep.dsn("vibespro"))
        try:
            if ordered:
                # Replicas share the partitions out before the backlog is committed, so the
                # figure is the drain's, not the replicas' first lease rounds.
                owners = await settle_ownership(nc.jetstream(), target_db, names, replicas)
                say(f"    partitions owned: {owners}")
            await dep.start_publisher("sea")
            spans0 = await sink_spans(bench)
            statements0 = await bench.servers.statement_counts()
            batches0 = await dep.batch_counts()
            # Every end-to-end drain, ordered or not, drains the same scattered backlog.
            before, started = await _commit_backlog(bench, sea, rows, mode, scattered=True)
            # The durable's consumers are cheap to poll (a consumer acks after marking the
            # inbox, or after parking); the inbox is counted once they say all is done.
            acked = await wait_for(
                "acked", lambda: _settled(nc.jetstream(), SEA_STREAM, names), rows, budget
            )
            if acked >= rows:
                await wait_for("processed", lambda: processed(target_db, SEA_DURABLE), rows)
            cpu = cpu_delta(before, bench.servers.book.snapshot())
            statements = statement_delta(statements0, await bench.servers.statement_counts())
            batches = await batches_since(dep, batches0)
            done = await processed(target_db, SEA_DURABLE)
            first, _, _ = await stream_span(nc.jetstream(), SEA_STREAM)
            last = await target_db.fetchval(
                "SELECT extract(epoch FROM max(processed_at)) FROM inbox_messages"
                " WHERE durable = $1", SEA_DURABLE,
            )  # fmt: skip
            books = await handler_books(target_db, "vibespro")
            order = await order_check(sea, target_db, "vibespro")
            order["parked_left"] = int(await target_db.fetchval(
                "SELECT count(*) FROM parked_messages WHERE durable = $1", SEA_DURABLE
            ))  # fmt: skip
        finally:
            await sea.close()
            await target_db.close()
            await nc.close()
        spans = await sink_spans(bench) - spans0
    rate = done / max(float(last) - first, 1e-3)
    bench.results.book_cpu(label, mode, done, time.monotonic() - started, cpu)
    bench.results.book_statements(label, mode, done, statements)
    partitions = bench.options.ordered_partitions if ordered else 1
    bench.results.sections.setdefault(kind.section, {})[mode] = {
        "rows": rows, "processed": done, "msg_s": rate, "seconds": float(last) - first,
        "replicas": replicas, "partitions": partitions, "keys": AGGREGATES, **books,
        "handler_batch": batched or 1,
        **order, "spans_exported": spans, "cpu_s": cpu, "batches": batches,
    }  # fmt: skip
    row.set(mode, rate)
    if done < rows:
        row.notes.append(f"tracing {mode}: partial, {done:,} of {rows:,} processed when the "
                         f"--drain-budget of {budget:.0f}s ran out")  # fmt: skip
    _check_books(bench, label, mode, rows if done >= rows else None, books)
    if books["ids_called_twice"]:
        row.notes.append(f"tracing {mode}: {books['ids_called_twice']:,} events called twice "
                         "(a timed-out call retried and answered 409; applied once)")  # fmt: skip
    _note_spans(bench, mode, spans)
    if ordered:
        _judge_order(bench, label, mode, order)
    shown = f"{order['order_violations']:,} order violations over {order['keys']:,} keys"
    say(f"  end-to-end {'ordered ' if ordered else ''}drain x{replicas}, tracing {mode}: "
        f"{rate:,.0f} msg/s ({shown})")  # fmt: skip


def _judge_order(bench: Bench, label: str, mode: str, order: dict[str, int]) -> None:
    """The ordered drain's violations in the table; any, or a message left parked, is an
    error of the run."""
    row = ferry_row(bench, "ferry.order_violations", "", "events")
    row.set(mode, float(order["order_violations"]), f"{order['order_violations']:,}")
    problems = []
    if order["order_violations"]:
        problems.append(f"{order['order_violations']:,} events applied after a later event "
                        "of their key")  # fmt: skip
    if order["parked_left"]:
        problems.append(f"{order['parked_left']:,} messages still parked")
    if order["order_unknown"]:
        problems.append(f"{order['order_unknown']:,} applied events not in the outbox")
    if problems:
        bench.results.errors.append(f"{label} [tracing {mode}]: " + "; ".join(problems))


async def _settled(js: Any, stream: str, consumers: list[str]) -> int:
    """Messages of ``stream`` that ``consumers`` (together reading all of it once) acked:
    every stored message less those not yet delivered or not yet acked."""
    stored = await _stream_count(js, stream)
    waiting = 0
    for name in consumers:
        info = await js.consumer_info(stream, name)
        waiting += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return stored - waiting


#: Longest wait for the replicas of an ordered durable to share its partitions out.
OWNERSHIP_WAIT = 120.0


async def settle_ownership(
    js: Any, conn: asyncpg.Connection, consumers: list[str], replicas: int
) -> dict[str, int]:
    """Wait until the partitions are held by ``replicas`` owners in fair shares and every
    partition's consumer has a pull request waiting; the partitions each owner holds."""
    partitions = len(consumers)
    fair = -(-partitions // replicas)
    deadline = time.monotonic() + OWNERSHIP_WAIT
    owners: dict[str, int] = {}
    while time.monotonic() < deadline:
        held = await conn.fetch(
            "SELECT owner, count(*) AS n FROM partition_leases WHERE durable = $1"
            " AND NOT released AND expires_at > clock_timestamp() GROUP BY owner", SEA_DURABLE,
        )  # fmt: skip
        owners = {r["owner"]: int(r["n"]) for r in held}
        shared = (
            sum(owners.values()) == partitions
            and len(owners) == min(replicas, partitions)
            and max(owners.values()) <= fair
        )
        if shared:
            infos = [await js.consumer_info(SEA_STREAM, name) for name in consumers]
            if all(int(info.num_waiting or 0) > 0 for info in infos):
                return owners
        await asyncio.sleep(0.2)
    raise TimeoutError(f"partitions not shared out by {replicas} replicas within "
                       f"{OWNERSHIP_WAIT:.0f}s: {owners}")  # fmt: skip


async def order_check(
    source: asyncpg.Connection, target: asyncpg.Connection, handler: str
) -> dict[str, int]:
    """Per key (the event's aggregate), whether the handler applied its events in the order
    the producer committed them (the outbox's ``seq``; the publisher keeps each key's order
    into the stream): :func:`count_order_violations` over the handler's ledger
    (``handler_calls``, whose ``id`` is taken in the applying transaction) in ``id`` order.
    """
    outbox = await source.fetch(
        "SELECT id, aggregate_type || '/' || aggregate_id AS key, seq FROM outbox_events"
    )
    applied = await target.fetch(
        "SELECT message_id FROM handler_calls WHERE handler = $1 AND status = 200 ORDER BY id",
        handler,
    )
    return count_order_violations(
        {r["id"]: (r["key"], int(r["seq"])) for r in outbox}, [r["message_id"] for r in applied]
    )


def count_order_violations(
    place: Mapping[uuid.UUID, tuple[str, int]], applied: Iterable[uuid.UUID]
) -> dict[str, int]:
    """Events applied after an event of their key that was committed later.

    ``place``: each event's key and commit position; ``applied``: events in the order the
    handler applied them. Returns the keys seen, the events checked, the violations and
    the applied events ``place`` does not know.
    """
    latest: dict[str, int] = {}
    checked = violations = unknown = 0
    for message_id in applied:
        found = place.get(message_id)
        if found is None:
            unknown += 1
            continue
        checked += 1
        key, seq = found
        if seq < latest.get(key, -1):
            violations += 1
        else:
            latest[key] = seq
    return {"keys": len(latest), "order_checked": checked, "order_violations": violations,
            "order_unknown": unknown}  # fmt: skip


def _check_books(
    bench: Bench, label: str, mode: str, rows: int | None, books: dict[str, int]
) -> None:
    """Every event applied once and none dead-lettered (second calls are noted, not errors).

    ``rows`` None: a partial drain, whose applied count is not known in advance.
    """
    problems = []
    if rows is not None and books["handler_applied"] != rows:
        problems.append(f"{books['handler_applied']:,} applied of {rows:,}")
    if books["ids_called_twice"]:
        # Not an error: a call that timed out is retried and answered 409 (applied once).
        say(f"  note: {books['ids_called_twice']:,} events were called more than once")
    if books["dead_lettered"]:
        problems.append(f"{books['dead_lettered']:,} dead-lettered")
    if problems:
        bench.results.errors.append(f"{label} [tracing {mode}]: " + "; ".join(problems))


def _note_spans(bench: Bench, mode: str, spans: int) -> None:
    if mode == "on":
        seen = bench.tracing_available.get("on", False)
        bench.tracing_available["on"] = seen or spans > 0


# ------------------------------------------------------------------ latency under load


@dataclass
class Step:
    """One fixed-rate step: what the producer did and what the pipeline made of it."""

    rate: int
    producer: dict[str, Any]
    latencies: dict[str, list[float]]
    unprocessed: int
    cpu: dict[str, float]
    seconds: float
    #: Statement calls and ms during the step (``--statements``), else empty.
    statements: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: The pipeline had not finished an earlier step's backlog when this one began.
    started_busy: bool = False
    #: Per role: batches, messages in them and the mean batch during the step.
    batches: dict[str, dict[str, float]] = field(default_factory=dict)

    def p99(self, series: str) -> float:
        return summarize(self.latencies[series]).get("p99", float("nan"))


async def run_step(
    bench: Bench, dep: Deployment, lanes: list[dict[str, Any]], seconds: float,
    measure: Callable[[datetime], Awaitable[tuple[dict[str, list[float]], int]]],
    expected: Callable[[dict[str, Any]], int], grace: float = 30.0,
) -> Step:  # fmt: skip
    """Run the producer for ``seconds``; wait for the pipeline; read latencies back.

    A step starts on an idle pipeline: an earlier step's backlog is waited out first (up
    to ``--drain-budget``), else the step is marked ``started_busy``.
    """
    spec = {
        "seconds": seconds,
        "connections": bench.options.producer_connections,
        "form": bench.options.producer_form,
        "lanes": lanes,
    }
    busy = not await wait_idle(bench, dep, bench.options.drain_budget)
    book = bench.servers.book
    statements0 = await bench.servers.statement_counts()
    batches0 = await dep.batch_counts()
    before = book.snapshot()
    started = time.monotonic()
    producer = await run_worker(
        "loadgen", [PYTHON, "-m", "bench.loadgen", "--spec", json.dumps(spec)], dep.env()
    )
    since = datetime.fromtimestamp(producer["wall_start"]).astimezone()
    want = expected(producer)
    deadline = time.monotonic() + grace
    # Cheap to ask (outbox index, consumer info) while the pipeline finishes the tail;
    # the latency query runs once it is idle (and once more if a row was still in flight).
    while time.monotonic() < deadline:
        if await pipeline_idle(bench, dep):
            break
        await asyncio.sleep(0.2)
    latencies, done = await measure(since)
    while done < want and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        latencies, done = await measure(since)
    cpu = cpu_delta(before, book.snapshot())
    cpu["producer"] = float(producer["cpu_s"])
    statements = statement_delta(statements0, await bench.servers.statement_counts())
    batches = await batches_since(dep, batches0)
    rate = int(sum(lane["rate"] for lane in lanes))
    elapsed = time.monotonic() - started
    return Step(
        rate,
        producer,
        latencies,
        max(want - done, 0),
        cpu,
        elapsed,
        statements=statements,
        started_busy=busy,
        batches=batches,
    )


async def batches_since(
    dep: Deployment, before: dict[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Each role's batches since ``before`` (:meth:`Deployment.batch_counts`), and a progress
    line with their means (1.0: no batching at all)."""
    batches = batch_delta(before, await dep.batch_counts())
    if batches:
        shown = ", ".join(f"{name} {b['mean']:.1f}" for name, b in sorted(batches.items()))
        say(f"    mean batch: {shown}")
    return batches


def statement_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """Calls and ms of each statement between two :meth:`Servers.statement_counts`."""
    out = {}
    for query, (calls, ms) in after.items():
        calls0, ms0 = before.get(query, (0.0, 0.0))
        if calls > calls0:
            out[query] = (calls - calls0, ms - ms0)
    return out


async def wait_idle(bench: Bench, dep: Deployment, timeout: float) -> bool:
    """Wait until the pipeline is idle; False if it is still busy after ``timeout``."""
    deadline = time.monotonic() + timeout
    reported = False
    while time.monotonic() < deadline:
        if await pipeline_idle(bench, dep):
            return True
        if not reported:
            say("    waiting for the pipeline to finish the previous step's backlog")
            reported = True
        await asyncio.sleep(1.0)
    return False


async def pipeline_idle(bench: Bench, dep: Deployment) -> bool:
    """No outbox row left unpublished and no durable with messages pending or unacked."""
    for context in dep.topology.contexts.values():
        conn = await asyncpg.connect(bench.servers.pg.dsn(context.database))
        try:
            pending = await conn.fetchval(
                "SELECT count(*) FROM outbox_events WHERE published_at IS NULL"
            )
        finally:
            await conn.close()
        if pending:
            return False
    nc = await nats.connect(bench.servers.nats.url)
    try:
        js = nc.jetstream()
        for name, durable in dep.topology.durables.items():
            # An ordered durable on a partitioned stream has a consumer per partition.
            for plan in dep.topology.consumers(name):
                info = await js.consumer_info(durable.stream, plan.name)
                if info.num_pending or info.num_ack_pending:
                    return False
    finally:
        await nc.close()
    return True


async def sea_latencies(
    source_dsn: str, target_dsn: str, since: datetime
) -> tuple[dict[str, list[float]], int]:
    """Latencies in ms of the events that occurred since ``since``.

    ``processed``: occurred_at → inbox processed_at (after the handler's 200), the
    headline; ``applied``: occurred_at → the handler's claim in its transaction;
    ``from_insert``: the outbox row's INSERT (recorded_at, inside the producer's
    transaction) → processed_at, i.e. without the producer's own queueing. The stages
    on the way: ``published`` (occurred_at → the publisher's claiming transaction) and
    ``received`` (occurred_at → the consumer's inbox claim).
    """
    target = await asyncpg.connect(target_dsn)
    try:
        records = await target.fetch(
            "SELECT i.message_id, i.processed_at,"
            " extract(epoch FROM i.processed_at - i.occurred_at) * 1000 AS processed,"
            " extract(epoch FROM a.applied_at - i.occurred_at) * 1000 AS applied,"
            " extract(epoch FROM i.received_at - i.occurred_at) * 1000 AS received"
            " FROM inbox_messages i LEFT JOIN handler_applied a"
            " ON a.message_id = i.message_id AND a.handler = 'vibespro'"
            " WHERE i.durable = $1 AND i.status = 'processed' AND i.occurred_at >= $2",
            SEA_DURABLE, since,
        )  # fmt: skip
    finally:
        await target.close()
    source = await asyncpg.connect(source_dsn)
    try:
        rows = await source.fetch(
            "SELECT id, recorded_at,"
            " extract(epoch FROM published_at - occurred_at) * 1000 AS published"
            " FROM outbox_events WHERE occurred_at >= $1",
            since,
        )
    finally:
        await source.close()
    inserted = {r["id"]: r["recorded_at"] for r in rows}
    from_insert = [
        (r["processed_at"] - inserted[r["message_id"]]).total_seconds() * 1000
        for r in records
        if r["message_id"] in inserted
    ]
    out = {
        "processed": [float(r["processed"]) for r in records],
        "applied": [float(r["applied"]) for r in records if r["applied"] is not None],
        "from_insert": from_insert,
        "published": [float(r["published"]) for r in rows if r["published"] is not None],
        "received": [float(r["received"]) for r in records],
    }
    return out, len(records)


def _sea_lane(dep: Deployment, rate: int) -> dict[str, Any]:
    return {"name": "sea", "dsn": dep.dsn("sea"), "event_type": "model_published", "rate": rate}


def _committed(producer: dict[str, Any]) -> int:
    return int(sum(lane["committed"] for lane in producer["lanes"]))


#: Issue 29 judges the p99 at 600 msg/s against the bare-bones pipeline's at that load;
#: the other loads' rows print their ratio without a target.
LATENCY_TARGETS = {ratios.LATENCY_RATE: ratios.LATENCY_TARGET}


async def latency(bench: Bench, mode: str) -> None:
    """Fixed offered loads, then (if selected) the highest sustained rate, on one deployment."""
    opts = bench.options
    async with bench.deployment("sea-vibespro", mode, f"latency-{mode}") as dep:
        handler_url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, handler_url)
        await dep.start_publisher("sea")
        source_dsn, target_dsn = dep.dsn("sea"), dep.dsn("vibespro")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await sea_latencies(source_dsn, target_dsn, since)

        say(f"latency, tracing {mode}: warm-up {opts.warmup_seconds:.0f}s at 200 msg/s")
        await run_step(bench, dep, [_sea_lane(dep, 200)], opts.warmup_seconds, measure,
                       _committed)  # fmt: skip
        if "latency" in opts.sections:
            for rate in opts.rates:
                await _latency_step(bench, dep, mode, rate, measure)
        if "sustained" in opts.sections:
            await sustained(bench, dep, mode, measure)


async def _latency_step(bench: Bench, dep: Deployment, mode: str, rate: int,
                        measure: Any) -> None:  # fmt: skip
    seconds = bench.options.seconds
    say(f"latency at {rate:,} msg/s offered for {seconds:.0f}s, tracing {mode}")
    spans0 = await sink_spans(bench)
    step = await run_step(bench, dep, [_sea_lane(dep, rate)], seconds, measure, _committed)
    spans = await sink_spans(bench) - spans0
    _record_latency(bench, mode, f"{rate:,} msg/s", f"ferry.latency_{rate}",
                    f"end-to-end latency p50/p95/p99 at {rate:,} msg/s offered",
                    step, "processed", LATENCY_TARGETS.get(rate), spans,
                    what=ratios.latency_book(rate))  # fmt: skip
    _note_handler_calls(bench, f"ferry.latency_{rate}", dep)


def _note_handler_calls(bench: Bench, key: str, dep: Deployment) -> None:
    """Say how the measured lane calls its handler (as the shipped topology declares)."""
    batch = dep.topology.durables[SEA_DURABLE].handler.batch
    bench.results.meta["latency_handler_batch"] = batch  # the CPU ratio's like-with-like
    calls = f"batch calls of up to {batch}" if batch > 1 else "per-message calls"
    note = f"{SEA_DURABLE} as topologies/sea-vibespro.yaml ships it: {calls}"
    row = bench.results.row(key, "", "")
    if note not in row.notes:
        row.notes.append(note)


def _record_latency(
    bench: Bench, mode: str, series: str, key: str, label: str, step: Step, column: str,
    target: Target | None, spans: int, lane: str = "", book: bool = True,
    what: str = "",
) -> None:  # fmt: skip
    values = step.latencies[column]
    stats = summarize(values)
    row = ferry_row(bench, key, label, "ms", target=target)
    shown = f"{stats.get('p50', 0):.1f}/{stats.get('p95', 0):.1f}/{stats.get('p99', 0):.1f}"
    row.set(mode, stats.get("p99", float("nan")), shown if values else "n/m")
    producer = step.producer["lanes"]
    if lane:
        producer = [p for p in producer if p["name"] == lane] or producer
    achieved = sum(p["achieved"] for p in producer)
    offered = sum(p["offered"] for p in producer)
    said = "" if mode == "raw" else f"tracing {mode}: "
    if offered and achieved < SUSTAIN_ACHIEVED * offered:
        row.notes.append(f"{said}the producer achieved only {achieved:,.0f} msg/s")
    if step.unprocessed:
        row.notes.append(f"{said}{step.unprocessed:,} events not processed in time")
    if step.started_busy:
        row.notes.append(f"{said}began before the previous step's backlog was done")
    bench.results.samples.setdefault(mode, {})[series] = values
    doc = {"offered": offered, "achieved": achieved, "latency_ms": stats,
           "other_latencies_ms": {k: summarize(v) for k, v in step.latencies.items()},
           "unprocessed": step.unprocessed, "producer": step.producer,
           "spans_exported": spans, "cpu_s": step.cpu, "batches": step.batches}  # fmt: skip
    bench.results.sections.setdefault("latency", {}).setdefault(mode, {})[series] = doc
    if book:
        events = max(_committed(step.producer), 1)
        if not what:
            what = ("mediation, per E event (2 lanes)" if lane == "module_e"
                    else f"latency {series}")  # fmt: skip
        bench.results.book_cpu(what, mode, events, step.seconds, step.cpu)
        bench.results.book_statements(what, mode, events, step.statements)
    _note_spans(bench, mode, spans)
    say(f"  {series}, tracing {mode}: p50 {stats.get('p50', 0):.1f}  p95 "
        f"{stats.get('p95', 0):.1f}  p99 {stats.get('p99', 0):.1f} ms "
        f"(producer {achieved:,.0f}/s, unprocessed {step.unprocessed})")  # fmt: skip


async def sustained(
    bench: Bench, dep: Deployment, mode: str, measure: Any, *, bare_bones: bool = False
) -> None:
    """Raise the offered load step by step; the highest step that holds is the figure.

    The search is :func:`bench.search.search_sustained`: upwards from ``--sustain-start``
    by ``--sustain-step`` until a step fails; if the very first fails, downwards by halves
    (to 100 msg/s) until one holds; then bisection until the rates that held and failed are
    an eighth apart. A step failed on latency alone is run once more before it counts.

    ``bare_bones``: the same search and criterion on the bare-bones pipeline
    (:func:`prototype`, mode ``raw``), the baseline of Ferry's figure.
    """
    what = "bare-bones sustained" if bare_bones else "sustained"
    tried: list[dict[str, Any]] = []
    opts = bench.options

    async def step(rate: int) -> str:
        return await _sustain_step(bench, dep, mode, rate, measure, tried, what)

    found = await search.search_sustained(
        step, start=opts.sustain_start, increment=opts.sustain_step, ceiling=opts.sustain_max
    )
    passed, failed = found.passed, found.failed
    if bare_bones:
        row = bench.results.row(ratios.PROTO_SUSTAINED_KEY, "bare-bones pipeline, highest "
                                "sustained rate, producer on the box", "msg/s")  # fmt: skip
    else:
        row = ferry_row(bench, "ferry.sustained", "highest sustained rate, producer on the box "
                        "(÷ bare-bones)", "msg/s", target=ratios.SUSTAINED_TARGET)  # fmt: skip
        _note_handler_calls(bench, "ferry.sustained", dep)
    said = "" if bare_bones else f"tracing {mode}: "
    row.set(mode, float(passed) if passed is not None else None)
    if passed is None:
        row.notes.append(f"{said}not even 100 msg/s held")
    if failed is not None:
        row.notes.append(f"{said}{failed[0]:,} msg/s failed: {failed[1]}")
    elif passed is not None:
        row.notes.append(f"{said}the search stopped at its ceiling --sustain-max")
    bench.results.sections.setdefault("sustained", {})[mode] = {
        "highest": passed, "first_failure": failed, "steps": tried,
        "criteria": {"achieved_fraction": SUSTAIN_ACHIEVED, "p99_ms": SUSTAIN_P99_MS,
                     "grace_s": 10},
    }  # fmt: skip


async def _sustain_step(bench: Bench, dep: Deployment, mode: str, rate: int, measure: Any,
                        tried: list[dict[str, Any]], what: str) -> str:  # fmt: skip
    """Run one step; return why it failed ('' when it held)."""
    seconds = bench.options.seconds
    tracing = "" if mode == "raw" else f", tracing {mode}"
    say(f"{what}? {rate:,} msg/s for {seconds:.0f}s{tracing}")
    step = await run_step(bench, dep, [_sea_lane(dep, rate)], seconds, measure, _committed,
                          grace=10.0)  # fmt: skip
    lane = step.producer["lanes"][0]
    p99 = step.p99("processed")
    reasons = []
    if step.started_busy:
        reasons.append("the previous step's backlog was not done after --drain-budget")
    if lane["errors"]:
        reasons.append(f"{lane['errors']} producer errors")
    if lane["achieved"] < SUSTAIN_ACHIEVED * rate:
        reasons.append(f"producer achieved {lane['achieved']:,.0f} msg/s")
    if step.unprocessed:
        reasons.append(f"{step.unprocessed:,} events unprocessed 10 s after the producer stopped")
    if not p99 <= SUSTAIN_P99_MS:
        reasons.append(f"p99 {p99:,.0f} ms" if p99 == p99 else "no event processed")
    verdict = "; ".join(reasons)
    tried.append({"rate": rate, "achieved": lane["achieved"], "p99_ms": p99,
                  "unprocessed": step.unprocessed, "held": not verdict, "why_not": verdict,
                  "cpu_s": step.cpu})  # fmt: skip
    bench.results.book_cpu(f"{what} step {rate:,} msg/s", mode,
                           max(lane["committed"], 1), step.seconds, step.cpu)  # fmt: skip
    bench.results.book_statements(f"{what} step {rate:,} msg/s", mode,
                                  max(lane["committed"], 1), step.statements)  # fmt: skip
    say(f"  {rate:,} msg/s: {'held' if not verdict else 'failed: ' + verdict} (p99 {p99:,.1f} ms)")
    return verdict


# ------------------------------------------------------------------- bare-bones pipeline


async def prototype(bench: Bench) -> None:
    """The bare-bones pipeline (:mod:`bench.prototype`) at each of ``--rates``.

    Same servers, same producer, same stream, durable and databases as Ferry's latency
    section; only the three roles differ. Its p99 is the baseline of Ferry's latency rows.
    With the ``sustained`` section selected too, :func:`sustained` then searches its highest
    sustained rate, the baseline of Ferry's.
    """
    opts = bench.options
    async with bench.deployment("sea-vibespro", "off", "prototype") as dep:
        source_dsn, target_dsn = dep.dsn("sea"), dep.dsn("vibespro")
        port = free_port()
        url = f"http://127.0.0.1:{port}/handle"
        roles = [
            ("handler-proto", ["handler", "--dsn", target_dsn, "--port", str(port)]),
            ("consumer-proto", ["consumer", "--dsn", target_dsn, "--url", url,
                                "--nats-url", bench.servers.nats.url]),
            ("publisher-proto", ["publisher", "--dsn", source_dsn,
                                 "--nats-url", bench.servers.nats.url]),
        ]  # fmt: skip
        for name, args in roles:
            await _start_proto(bench, dep, name, args)

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await proto_latencies(source_dsn, target_dsn, since)

        say(f"bare-bones pipeline: warm-up {opts.warmup_seconds:.0f}s at 200 msg/s")
        await run_step(bench, dep, [_sea_lane(dep, 200)], opts.warmup_seconds, measure,
                       _committed)  # fmt: skip
        for rate in opts.rates:
            say(f"bare-bones pipeline at {rate:,} msg/s offered for {opts.seconds:.0f}s")
            step = await run_step(bench, dep, [_sea_lane(dep, rate)], opts.seconds, measure,
                                  _committed)  # fmt: skip
            _record_latency(bench, "raw", f"bare-bones {rate:,} msg/s", f"raw.proto_{rate}",
                            f"bare-bones pipeline latency p50/p95/p99 at {rate:,} msg/s",
                            step, "processed", None, 0,
                            what=f"bare-bones pipeline {rate:,} msg/s")  # fmt: skip
        if "sustained" in opts.sections:
            # The baseline of Ferry's sustained rate: the same search, on the same box.
            await sustained(bench, dep, "raw", measure, bare_bones=True)


async def _start_proto(bench: Bench, dep: Deployment, name: str, args: list[str]) -> None:
    ready = dep.logs / f"{dep.label}-{name}.ready"
    ready.unlink(missing_ok=True)
    argv = [PYTHON, "-m", "bench.prototype", *args, "--ready", str(ready)]
    proc = await spawn(f"{dep.label}-{name}", name.split("-")[0], argv, dep.env(), dep.logs)
    dep.procs.append(proc)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"bare-bones {name} did not start:\n{proc.log_tail()}")
        await asyncio.sleep(0.05)
    bench.servers.book.add(name, proc.pid)
    dep.role_names.append(name)


async def proto_latencies(
    source_dsn: str, target_dsn: str, since: datetime
) -> tuple[dict[str, list[float]], int]:
    """The bare-bones pipeline's latencies, by the definitions of :func:`sea_latencies`."""
    target = await asyncpg.connect(target_dsn)
    try:
        records = await target.fetch(
            "SELECT extract(epoch FROM i.processed_at - i.occurred_at) * 1000 AS processed,"
            " extract(epoch FROM a.applied_at - i.occurred_at) * 1000 AS applied,"
            " extract(epoch FROM i.received_at - i.occurred_at) * 1000 AS received"
            " FROM proto_inbox i LEFT JOIN proto_applied a USING (id)"
            " WHERE i.processed_at IS NOT NULL AND i.occurred_at >= $1", since,
        )  # fmt: skip
    finally:
        await target.close()
    source = await asyncpg.connect(source_dsn)
    try:
        published = await source.fetch(
            "SELECT extract(epoch FROM published_at - occurred_at) * 1000 AS published"
            " FROM outbox_events WHERE occurred_at >= $1 AND published_at IS NOT NULL", since,
        )  # fmt: skip
    finally:
        await source.close()
    out = {
        "processed": [float(r["processed"]) for r in records],
        "applied": [float(r["applied"]) for r in records if r["applied"] is not None],
        "published": [float(r["published"]) for r in published],
        "received": [float(r["received"]) for r in records],
    }
    return out, len(records)


# ----------------------------------------------------------------------------- mediation


async def mediation(bench: Bench, mode: str) -> None:
    """Lanes E→F and F→G of INFRA-005 together, producer feeding E at the E→F peak."""
    opts = bench.options
    rate = opts.mediation_rate
    say(f"mediation lanes, {rate:,} msg/s into E→F (each forwarded F→G), tracing {mode}")
    async with bench.deployment("mediation", mode, f"mediation-{mode}") as dep:
        f_url = await dep.start_handler("module_f")
        g_url = await dep.start_handler("module_g")
        await dep.start_consumer("cg_f_ingest", f_url)
        await dep.start_consumer("cg_g_archive", g_url)
        await dep.start_publisher("module_e")
        await dep.start_publisher("module_f")
        f_dsn, g_dsn = dep.dsn("module_f"), dep.dsn("module_g")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await mediation_latencies(f_dsn, g_dsn, since)

        lane = {"name": "module_e", "dsn": dep.dsn("module_e"),
                "event_type": "opportunity_scored", "rate": rate}  # fmt: skip
        await run_step(bench, dep, [{**lane, "rate": 200}], opts.warmup_seconds, measure,
                       _committed)  # fmt: skip
        spans0 = await sink_spans(bench)
        step = await run_step(bench, dep, [lane], opts.seconds, measure, _committed)
        spans = await sink_spans(bench) - spans0
    series = {"e_to_f": "E→F", "f_to_g": "F→G", "e_to_g": "E→F→G"}
    # Module F forwards every E event: F→G is offered what E→F is (the seed's peaks are
    # 600 E→F and 400 F→G). Each lane is judged against the seed's own p99 < 500 ms.
    offered = f"{rate:,} E→F + {rate:,} F→G msg/s (every E event forwarded)"
    for column, name in series.items():
        _record_latency(
            bench, mode, f"mediation {name}", f"ferry.mediation_{column}",
            f"mediation {name} latency p50/p95/p99, {offered}", step, column,
            ratios.MEDIATION_TARGET if column != "e_to_g" else None, spans, lane="module_e",
            book=column == "e_to_f",
        )  # fmt: skip
        row = ferry_row(bench, f"ferry.mediation_{column}", "", "ms")
        note = (f"offered {rate:,} msg/s into E→F and, as module F forwards every E event, "
                f"{rate:,} into F→G; the seed's peak is 600 E→F + 400 F→G")  # fmt: skip
        if column != "e_to_g" and note not in row.notes:
            row.notes.append(note)


async def mediation_latencies(
    f_dsn: str, g_dsn: str, since: datetime
) -> tuple[dict[str, list[float]], int]:
    """E→F (F's inbox), F→G (G's inbox) and E→G through F's forward (causation id)."""
    f = await asyncpg.connect(f_dsn)
    g = await asyncpg.connect(g_dsn)
    try:
        f_rows = await f.fetch(
            "SELECT message_id, occurred_at, processed_at FROM inbox_messages"
            " WHERE durable = 'cg_f_ingest' AND status = 'processed' AND occurred_at >= $1",
            since,
        )
        forwards = await f.fetch(
            "SELECT id, causation_id FROM outbox_events WHERE occurred_at >= $1", since
        )
        g_rows = await g.fetch(
            "SELECT message_id, occurred_at, processed_at FROM inbox_messages"
            " WHERE durable = 'cg_g_archive' AND status = 'processed' AND occurred_at >= $1",
            since,
        )
    finally:
        await f.close()
        await g.close()
    e_occurred = {r["message_id"]: r["occurred_at"] for r in f_rows}
    cause = {r["id"]: r["causation_id"] for r in forwards}
    ms = 1000.0
    e_to_f = [(r["processed_at"] - r["occurred_at"]).total_seconds() * ms for r in f_rows]
    f_to_g = [(r["processed_at"] - r["occurred_at"]).total_seconds() * ms for r in g_rows]
    e_to_g = []
    for r in g_rows:
        origin = e_occurred.get(cause.get(r["message_id"]))
        if origin is not None:
            e_to_g.append((r["processed_at"] - origin).total_seconds() * ms)
    # Done when every E event has come out of G as well.
    return {"e_to_f": e_to_f, "f_to_g": f_to_g, "e_to_g": e_to_g}, len(e_to_g)


# ----------------------------------------------------------------------------- the peer


async def peer(bench: Bench) -> None:
    """faststream-outbox relaying the same kind of backlog into the same nats-server."""
    rows = bench.options.peer_rows
    say(f"faststream-outbox drain of {rows:,} rows (the closest Python peer)")
    row = bench.results.row("peer.faststream_outbox", f"faststream-outbox drain, {rows:,} rows",
                            "msg/s")  # fmt: skip
    ratio_row = bench.results.row(
        "ferry.vs_peer",
        "outbox-publisher drain / faststream-outbox drain",
        "x",
        target=ratios.PEER_TARGET,
    )
    pg = bench.servers.pg
    conn = await asyncpg.connect(pg.dsn("postgres"))
    try:
        await conn.execute("DROP DATABASE IF EXISTS bench_peer WITH (FORCE)")
        await conn.execute("CREATE DATABASE bench_peer")
    finally:
        await conn.close()
    nc = await nats.connect(bench.servers.nats.url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name or "")
    finally:
        await nc.close()
    book = bench.servers.book
    before = book.snapshot()
    started = time.monotonic()
    opts = bench.options
    argv = [PYTHON, "-m", "bench.peer", "--dsn", pg.dsn("bench_peer"), "--nats-url",
            bench.servers.nats.url, "--rows", str(rows), "--workers", str(opts.peer_workers),
            "--budget", str(opts.drain_budget)]  # fmt: skip
    result = await run_worker("peer", argv, bench_env())
    cpu = cpu_delta(before, book.snapshot())
    bench.results.sections["peer"] = result
    if "error" in result:
        row.not_measured("raw", result["error"])
        ratio_row.not_measured("raw", result["error"])
        say(f"  faststream-outbox: not measured: {result['error']}")
        return
    cpu["faststream-outbox"] = float(result.get("cpu_s", 0.0))
    bench.results.book_cpu(f"faststream-outbox drain {rows:,}", "raw", int(result["in_stream"]),
                           time.monotonic() - started, cpu)  # fmt: skip
    row.set("raw", float(result["msg_s"]))
    if result["in_stream"] < rows:
        row.notes.append(f"partial: {result['in_stream']:,} of {rows:,} relayed when the "
                         "--drain-budget ran out")  # fmt: skip
    say(f"  faststream-outbox: {result['msg_s']:,.0f} msg/s")


def finish_peer_ratio(results: Results) -> None:
    """The publisher-to-peer ratio per mode, once both are known."""
    peer_row = next((r for r in results.rows if r.key == "peer.faststream_outbox"), None)
    pub = next((r for r in results.rows if r.key == "ferry.publisher_drain"), None)
    ratio = next((r for r in results.rows if r.key == "ferry.vs_peer"), None)
    if peer_row is None or pub is None or ratio is None:
        return
    peer_rate = peer_row.values.get("raw")
    if not peer_rate:
        return
    ratio.values.pop("raw", None)
    ratio.shown.pop("raw", None)
    for mode, value in pub.values.items():
        if value is not None:
            ratio.set(mode, value / peer_rate, f"{value / peer_rate:.2f}")


def ordered_ratio_row(results: Results, replicas: int) -> Row:
    """The row of the ordered drain's throughput against the unordered one's."""
    return results.row(
        "ferry.ordered_vs_unordered",
        f"ordered drain / unordered drain, {replicas} consumer" + ("s" if replicas > 1 else ""),
        "x", target=Target(">=", 0.8, "≥ 0.8 x"),
    )  # fmt: skip


def finish_ordered_ratio(results: Results) -> None:
    """Ordered drain over unordered drain, per mode, once both are known.

    The yardstick is the unordered drain with as many consumer replicas as the ordered one
    (what ordering costs, everything else equal); the one-consumer drain's ratio is noted.
    """
    rows = {r.key: r for r in results.rows}
    ordered = rows.get("ferry.e2e_drain_ordered")
    if ordered is None:
        return
    replicas = results.sections.get("e2e_drain_ordered", {})
    count = next((int(d["replicas"]) for d in replicas.values()), 2)
    same = rows.get(f"ferry.e2e_drain_{count}")
    ratio = ordered_ratio_row(results, count)
    if same is None:
        ratio.notes.append(f"not measured: no unordered drain with {count} consumers")
        return
    one = rows.get("ferry.e2e_drain_1")
    for mode, value in ordered.values.items():
        base = same.values.get(mode)
        if value is None or not base:
            ratio.not_measured(mode, "not measured: a drain of this mode is missing")
            continue
        ratio.set(mode, value / base, f"{value / base:.2f}")
        single = one.values.get(mode) if one is not None and count != 1 else None
        if single:
            ratio.notes.append(f"tracing {mode}: {value / single:.2f} x the unordered drain "
                               "with 1 consumer")  # fmt: skip


# -------------------------------------------------------------------------------- soak


async def soak(bench: Bench, mode: str) -> None:
    """Resident memory of every role over a long run at a fixed rate."""
    opts = bench.options
    seconds, rate = opts.soak_seconds, opts.soak_rate
    say(f"soak: {rate:,} msg/s for {seconds:.0f}s, resident memory of every role, tracing {mode}")
    row = ferry_row(bench, "ferry.rss_growth",
                    f"largest resident-memory growth of a role, {seconds:.0f}s at {rate:,} msg/s",
                    "%", target=Target("<=", 10.0, "≤ 10 %"))  # fmt: skip
    async with bench.deployment("sea-vibespro", mode, f"soak-{mode}") as dep:
        handler_url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, handler_url)
        await dep.start_publisher("sea")
        samples: list[dict[str, Any]] = []
        stop = asyncio.Event()

        async def sample() -> None:
            began = time.monotonic()
            every = max(seconds / 60, 1.0)
            while not stop.is_set():
                rss = {n: v for n, v in bench.servers.book.rss().items() if n in dep.role_names}
                samples.append({"t": round(time.monotonic() - began, 1), "rss": rss})
                await sleep_unless(stop, every)

        sampler = asyncio.create_task(sample())
        source_dsn, target_dsn = dep.dsn("sea"), dep.dsn("vibespro")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await sea_latencies(source_dsn, target_dsn, since)

        step = await run_step(bench, dep, [_sea_lane(dep, rate)], seconds, measure, _committed)
        stop.set()
        await sampler
    growth = _rss_growth(samples)
    worst = max(growth.values(), default=float("nan"))
    row.set(mode, worst)
    bench.results.sections.setdefault("soak", {})[mode] = {
        "rate": rate, "seconds": seconds, "growth_percent": growth, "samples": samples,
        "latency_ms": summarize(step.latencies["processed"]), "unprocessed": step.unprocessed,
    }  # fmt: skip
    say("  resident memory growth per role: "
        + ", ".join(f"{n} {g:+.1f} %" for n, g in growth.items()))  # fmt: skip


def _rss_growth(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Per role: last sample against the first one after the first fifth (warm-up)."""
    if len(samples) < 3:
        return {}
    start = samples[max(1, len(samples) // 5)]["rss"]
    end = samples[-1]["rss"]
    return {n: round((end[n] - start[n]) / start[n] * 100, 1)
            for n in start if n in end and start[n]}  # fmt: skip
