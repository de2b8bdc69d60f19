"""Fixed-rate steps: the producer at a rate for a while, the pipeline waited out, latencies
read back from the databases."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from bench.books import batch_delta, cpu_delta, pair_delta
from bench.common import fetch, say, summarize
from bench.procs import PYTHON, run_worker
from bench.sections.base import SEA_DURABLE, Bench
from bench.world import Deployment


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
    took = await bench.servers.checkpoint()
    if took > 2.0:
        say(f"    checkpoint before the step took {took:.1f}s (writes of earlier steps)")
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
    cpu = split_producer_sessions(cpu_delta(before, book.snapshot()), producer)
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


#: The CPU book's entry for what PostgreSQL spent in the producer's own sessions.
PRODUCER_SESSIONS = "producer-pg"


def split_producer_sessions(cpu: dict[str, float], producer: dict[str, Any]) -> dict[str, float]:
    """The step's CPU book with the producer's own entries: its process's CPU, and what
    PostgreSQL spent in its sessions (its transactions) moved out of ``postgres``.

    A drain's backlog is inserted before its book opens, so the application's writes
    are not in a drain's PostgreSQL figure; taking them out here keeps a fixed-rate
    step's like it. A producer that could not read its sessions leaves ``postgres`` whole.
    """
    out = dict(cpu)
    out["producer"] = float(producer["cpu_s"])
    sessions = producer.get("sessions_cpu_s")
    if sessions is not None and "postgres" in out:
        moved = min(float(sessions), out["postgres"])
        out["postgres"] = round(out["postgres"] - moved, 3)
        out[PRODUCER_SESSIONS] = round(moved, 3)
    return out


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
    return pair_delta(before, after)


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


# Rows of an aggregate with a set-aside row wait for an operator, not for the pipeline
# (the volume section's history has one, 50,000 rows behind it).
_PENDING = """
SELECT EXISTS (SELECT 1 FROM outbox_events o WHERE o.published_at IS NULL
  AND (o.aggregate_type, o.aggregate_id) NOT IN (
    SELECT aggregate_type, aggregate_id FROM outbox_events
    WHERE published_at IS NULL AND set_aside_at IS NOT NULL))
"""


async def pipeline_idle(bench: Bench, dep: Deployment) -> bool:
    """No outbox row left to publish (but behind a set-aside row) and no durable with
    messages pending or unacked."""
    for context in dep.topology.contexts.values():
        conn = await asyncpg.connect(bench.servers.pg.dsn(context.database))
        try:
            pending = await conn.fetchval(_PENDING)
        finally:
            await conn.close()
        if pending:
            return False
    nc = await bench.servers.connect_nats()
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
    records = await fetch(
        target_dsn,
        "SELECT i.message_id, i.processed_at,"
        " extract(epoch FROM i.processed_at - i.occurred_at) * 1000 AS processed,"
        " extract(epoch FROM a.applied_at - i.occurred_at) * 1000 AS applied,"
        " extract(epoch FROM i.received_at - i.occurred_at) * 1000 AS received"
        " FROM inbox_messages i LEFT JOIN handler_applied a"
        " ON a.message_id = i.message_id AND a.handler = 'vibespro'"
        " WHERE i.durable = $1 AND i.status = 'processed' AND i.occurred_at >= $2",
        SEA_DURABLE,
        since,
    )
    rows = await fetch(
        source_dsn,
        "SELECT id, recorded_at,"
        " extract(epoch FROM published_at - occurred_at) * 1000 AS published"
        " FROM outbox_events WHERE occurred_at >= $1",
        since,
    )
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


def sea_lane(dep: Deployment, rate: int) -> dict[str, Any]:
    return {"name": "sea", "dsn": dep.dsn("sea"), "event_type": "model_published", "rate": rate}


def committed(producer: dict[str, Any]) -> int:
    return int(sum(lane["committed"] for lane in producer["lanes"]))


#: Issue 29 judges the p99 at 600 msg/s against the bare-bones pipeline's at that load;
#: the other loads' rows print their ratio without a target.
