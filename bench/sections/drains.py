"""Backlog drains: the outbox-publisher alone, and end to end with one or two consumers,
batch calls, or per-key order."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
import nats

from bench import ratios
from bench.books import cpu_delta
from bench.common import AGGREGATES, say, stream_span
from bench.ratios import BATCH_TARGET
from bench.report import Results, Row, Target
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
        _judge_order(bench, label, mode, order)
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
