"""Per-key order in the ordered drain: the replicas sharing the partitions out before the
backlog, the handler's ledger checked against the outbox, the violations judged, and the
ordered drain's throughput against the unordered one's."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

from bench.report import Results, Row, Target
from bench.sections.base import SEA_DURABLE, SEA_STREAM, Bench, ferry_row


def judge_order(bench: Bench, label: str, mode: str, order: dict[str, int]) -> None:
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
