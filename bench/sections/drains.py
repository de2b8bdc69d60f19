"""Backlog drains: the outbox-publisher alone, and end to end with one or two consumers,
batch calls, or per-key order.

This module runs the drains and books their figures; :mod:`bench.sections.drains_kinds`
holds what tells the end-to-end drains apart (rows, sections, topology changes), and
:mod:`bench.sections.drains_order` the per-key order check, the partition ownership wait
and the ordered/unordered ratio."""

from __future__ import annotations

import time
from typing import Any

import asyncpg
import nats

from bench import ratios
from bench.books import cpu_delta
from bench.common import AGGREGATES, say, stream_span
from bench.report import Row, Target
from bench.sections.base import (
    SEA_DURABLE,
    SEA_STREAM,
    Bench,
    ferry_row,
    fill_outbox,
    handler_books,
    note_spans,
    processed,
    sink_spans,
    wait_for,
)
from bench.sections.drains_kinds import drain_kind
from bench.sections.drains_order import count_order_violations as count_order_violations
from bench.sections.drains_order import finish_ordered_ratio as finish_ordered_ratio
from bench.sections.drains_order import (
    judge_order,
    order_check,
    ordered_ratio_row,
    settle_ownership,
)
from bench.sections.steps import batches_since, statement_delta


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
            before, started = await commit_backlog(bench, conn, rows, mode)
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
    note_spans(bench, mode, spans)
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


async def commit_backlog(
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


async def _e2e_drain(
    bench: Bench, mode: str, replicas: int, *, ordered: bool, batched: int = 0
) -> None:
    rows, budget = bench.options.rows, bench.options.drain_budget
    kind = drain_kind(bench, mode, replicas, ordered, batched)
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
            before, started = await commit_backlog(bench, sea, rows, mode, scattered=True)
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
    seconds = max(float(last) - first, 1e-3)
    rate = done / seconds
    bench.results.book_cpu(label, mode, done, time.monotonic() - started, cpu, merge=True)
    bench.results.book_statements(label, mode, done, statements)
    partitions = bench.options.ordered_partitions if ordered else 1
    run = {
        "rows": rows, "processed": done, "msg_s": rate, "seconds": seconds,
        "replicas": replicas, "partitions": partitions, "keys": AGGREGATES, **books,
        "handler_batch": batched or 1,
        **order, "spans_exported": spans, "cpu_s": cpu, "batches": batches,
    }  # fmt: skip
    modes = bench.results.sections.setdefault(kind.section, {})
    runs = [*modes[mode].get("runs", [modes[mode]]), run] if mode in modes else [run]
    modes[mode] = combine_runs(runs)
    row.set(mode, modes[mode]["msg_s"])
    if len(runs) > 1:
        note_runs(row, mode, runs)
    if done < rows:
        row.notes.append(f"tracing {mode}: partial, {done:,} of {rows:,} processed when the "
                         f"--drain-budget of {budget:.0f}s ran out")  # fmt: skip
    _check_books(bench, label, mode, rows if done >= rows else None, books)
    if books["ids_called_twice"]:
        row.notes.append(f"tracing {mode}: {books['ids_called_twice']:,} events called twice "
                         "(a timed-out call retried and answered 409; applied once)")  # fmt: skip
    note_spans(bench, mode, spans)
    if ordered:
        judge_order(bench, label, mode, order)
    shown = f"{order['order_violations']:,} order violations over {order['keys']:,} keys"
    say(f"  end-to-end {'ordered ' if ordered else ''}drain x{replicas}, tracing {mode}: "
        f"{rate:,.0f} msg/s ({shown})")  # fmt: skip


def combine_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One drain's figures from its runs (the one-consumer drain's pairs): every event
    over all their time (rows, processed, seconds and spans summed; the other figures
    are the last run's), each run kept as it was under ``runs``."""
    if len(runs) == 1:
        return runs[0]
    combined = dict(runs[-1])
    for key in ("rows", "processed", "seconds", "spans_exported"):
        combined[key] = sum(r[key] for r in runs)
    combined["msg_s"] = combined["processed"] / max(combined["seconds"], 1e-3)
    combined["runs"] = runs
    return combined


def note_runs(row: Row, mode: str, runs: list[dict[str, Any]]) -> None:
    """The row's note on a drain run more than once: each run's rate, and how the figure
    is made."""
    rates = ", ".join(f"{r['msg_s']:,.0f}" for r in runs)
    note = (f"tracing {mode}: {len(runs)} drains ({rates} msg/s), their order alternating "
            "with the other mode's; the figure is every event over all their time")  # fmt: skip
    row.notes[:] = [n for n in row.notes if not n.startswith(f"tracing {mode}: ") or
                    " drains (" not in n] + [note]  # fmt: skip


async def _settled(js: Any, stream: str, consumers: list[str]) -> int:
    """Messages of ``stream`` that ``consumers`` (together reading all of it once) acked:
    every stored message less those not yet delivered or not yet acked."""
    stored = await _stream_count(js, stream)
    waiting = 0
    for name in consumers:
        info = await js.consumer_info(stream, name)
        waiting += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return stored - waiting


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
