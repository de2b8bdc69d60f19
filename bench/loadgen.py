"""The load generator: a producer committing state + outbox transactions at fixed rates.

    python -m bench.loadgen --spec '{"seconds": 30, "connections": 8, "lanes": [...]}'

Each lane is ``{"name", "dsn", "event_type", "rate"}``. Every event is one transaction
on a pooled connection, the way an application produces with Ferry: an upsert of the
aggregate's row in ``bench_state`` and :func:`shared.adapters.producer.record_event` (validation
against the manifests included), committed together. With ``"form": "statement"`` in
the spec, the upsert and the event go as one statement instead
(:func:`shared.adapters.producer.record_event_with`: one round trip, not four).

The load is open-loop: event ``i`` of a lane is due at ``start + i / rate`` whatever
happened to earlier ones, and its ``occurred_at`` is that due instant. A producer that
falls behind therefore shows in the end-to-end latency instead of silently lowering the
load (no coordinated omission); the lag from due instant to commit is reported too.
The pool is Ferry's (:func:`shared.adapters.postgres.create_pool`), which skips asyncpg's
session reset on every release, as an application on Ferry's helpers would.
Tracing follows the FERRY_* variables like a role (the producer's ``create`` span is
the root of each event's trace, so it is where 10 % sampling decides).

It also reads, by pid, the CPU its PostgreSQL sessions spent over the run
(``sessions_cpu_s``), which the bench books apart from the server's figure.

Prints progress on stderr and one result line on stdout (see :mod:`bench.common`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import psutil

from bench.common import AGGREGATES, emit, progress, summarize
from shared.adapters.postgres import Statement, create_pool
from shared.adapters.producer import record_event, record_event_with
from shared.runtime import loop as event_loop
from shared.runtime.settings import CommonSettings
from shared.telemetry import setup_tracing

#: How the producer writes each event (see the module docstring).
FORMS = ("transaction", "statement")

STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS bench_state"
    " (id TEXT PRIMARY KEY, n BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)"
)
STATE_UPSERT = (
    "INSERT INTO bench_state (id, n, updated_at) VALUES ($1, $2, now())"
    " ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n, updated_at = EXCLUDED.updated_at"
)
#: Where the producer starts after its pools are open (all lanes start together).
START_DELAY = 0.3


def payload_of(event_type: str, index: int) -> tuple[str, str, dict[str, Any]]:
    """Aggregate type, aggregate id and payload of the ``index``-th event of a type."""
    key = index % AGGREGATES
    if event_type == "model_published":
        return "model", f"m{key}", {"model_id": f"m{key}", "name": f"bench model {index}"}
    if event_type == "opportunity_scored":
        score = round(random.random() * 100, 3)
        return "opportunity", f"o{key}", {"opportunity_key": f"o{key}", "score": score}
    raise ValueError(f"the load generator has no payload for event type {event_type!r}")


@dataclass
class Lane:
    """One stream of events at a fixed rate into one context's outbox."""

    name: str
    dsn: str
    event_type: str
    rate: float
    committed: int = 0
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    last_commit: float = 0.0
    #: ``transaction`` (BEGIN, upsert, record_event, COMMIT) or ``statement``.
    form: str = "transaction"

    async def one(self, pool: asyncpg.Pool, index: int, due_wall: datetime, due: float) -> None:
        aggregate_type, aggregate_id, payload = payload_of(self.event_type, index)
        occurred = min(due_wall, datetime.now(UTC))
        event: dict[str, Any] = {
            "aggregate_type": aggregate_type,
            "aggregate_id": aggregate_id,
            "event_type": self.event_type,
            "payload": payload,
            "occurred_at": occurred,
        }
        try:
            if self.form == "statement":
                async with pool.acquire() as conn:
                    change = Statement(STATE_UPSERT, (aggregate_id, index))
                    await record_event_with(conn, change, **event)
            else:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(STATE_UPSERT, aggregate_id, index)
                    await record_event(conn, **event)
        except Exception as exc:  # counted and reported; the run goes on
            self.errors += 1
            if len(self.first_errors) < 3:
                self.first_errors.append(f"{type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        self.committed += 1
        self.last_commit = now
        self.lags_ms.append((now - due) * 1000)

    def result(self, start: float, seconds: float) -> dict[str, Any]:
        span = max(self.last_commit - start, seconds) if self.committed else seconds
        return {
            "name": self.name,
            "event_type": self.event_type,
            "offered": self.rate,
            "scheduled": int(self.rate * seconds),
            "committed": self.committed,
            "errors": self.errors,
            "first_errors": self.first_errors,
            "achieved": round(self.committed / span, 1),
            "commit_lag_ms": summarize(self.lags_ms),
        }


async def _drive(lane: Lane, pool: asyncpg.Pool, start: float, wall0: datetime, seconds: float,
                 inflight: set[asyncio.Task[None]]) -> None:  # fmt: skip
    total = int(lane.rate * seconds)
    interval = 1.0 / lane.rate
    for index in range(total):
        due = start + index * interval
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        due_wall = wall0 + timedelta(seconds=due - start)
        task = asyncio.create_task(lane.one(pool, index, due_wall, due))
        inflight.add(task)
        task.add_done_callback(inflight.discard)


async def _report(lanes: list[Lane], start: float, seconds: float) -> None:
    while True:
        await asyncio.sleep(5)
        elapsed = time.monotonic() - start
        done = ", ".join(f"{lane.name} {lane.committed:,}" for lane in lanes)
        progress(f"producer {elapsed:5.0f}/{seconds:.0f}s: committed {done}")


async def session_pids(pool: asyncpg.Pool, size: int) -> list[int]:
    """The server pids of the pool's ``size`` connections (each one held at once)."""
    held = [await pool.acquire() for _ in range(size)]
    try:
        return [conn.get_server_pid() for conn in held]
    finally:
        for conn in held:
            await pool.release(conn)


def sessions_cpu(pids: list[int]) -> float | None:
    """CPU seconds (user + system) of the producer's PostgreSQL backends so far, or None
    when one cannot be read (a server on another machine, or a backend gone)."""
    total = 0.0
    try:
        for pid in pids:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    except psutil.Error:
        return None
    return total


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    seconds = float(spec["seconds"])
    connections = int(spec.get("connections", 8))
    form = str(spec.get("form", "transaction"))
    if form not in FORMS:
        raise SystemExit(f"spec form {form!r}: use one of {', '.join(FORMS)}")
    lanes = [
        Lane(d["name"], d["dsn"], d["event_type"], float(d["rate"]), form=form)
        for d in spec["lanes"]
    ]
    tracing = setup_tracing("bench-producer", CommonSettings())
    pools: dict[str, asyncpg.Pool] = {}
    for lane in lanes:
        if lane.dsn not in pools:
            pools[lane.dsn] = await create_pool(lane.dsn, min_size=connections,
                                                max_size=connections)  # fmt: skip
            async with pools[lane.dsn].acquire() as conn:
                await conn.execute(STATE_DDL)
    pids = [pid for pool in pools.values() for pid in await session_pids(pool, connections)]
    inflight: set[asyncio.Task[None]] = set()
    start = time.monotonic() + START_DELAY
    wall0 = datetime.now(UTC) + timedelta(seconds=START_DELAY)
    reporter = asyncio.create_task(_report(lanes, start, seconds))
    cpu0 = time.process_time()
    sessions0 = sessions_cpu(pids)
    await asyncio.gather(
        *(_drive(lane, pools[lane.dsn], start, wall0, seconds, inflight) for lane in lanes)
    )
    while inflight:
        await asyncio.gather(*list(inflight))
    cpu = time.process_time() - cpu0
    sessions1 = sessions_cpu(pids)
    sessions = None if sessions0 is None or sessions1 is None else sessions1 - sessions0
    reporter.cancel()
    for pool in pools.values():
        await pool.close()
    tracing.shutdown()
    return {
        "seconds": seconds,
        "connections": connections,
        "form": form,
        "cpu_s": round(cpu, 3),
        # What PostgreSQL spent in the producer's own sessions (its transactions); the
        # bench books it apart from the servers' CPU (None: not readable from here).
        "sessions_cpu_s": None if sessions is None else round(sessions, 3),
        "wall_start": wall0.timestamp(),
        "lanes": [lane.result(start, seconds) for lane in lanes],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("--spec", required=True, help="JSON: seconds, connections, lanes")
    args = parser.parse_args(argv)
    emit(event_loop.run(run(json.loads(args.spec))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
