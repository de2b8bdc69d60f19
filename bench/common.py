"""What the bench's processes share: paths, the worker protocol, statistics, timings."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
from nats.js import JetStreamContext

#: The repository root (roles run with it as working directory and on PYTHONPATH).
ROOT = Path(__file__).resolve().parents[1]
#: Distinct aggregates the bench's events are spread over (per-aggregate order holds).
AGGREGATES = 1000
#: The result line a worker process prints last on stdout starts with this.
RESULT_PREFIX = "BENCH-RESULT "
#: A worker's stderr lines starting with this are progress, echoed by the orchestrator.
PROGRESS_PREFIX = "progress: "

_STARTED = time.monotonic()


def say(message: str) -> None:
    """One progress line, prefixed with the time since this process started."""
    elapsed = int(time.monotonic() - _STARTED)
    print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}", flush=True)


def progress(message: str) -> None:
    """A worker's progress line (stderr; the orchestrator shows it)."""
    print(PROGRESS_PREFIX + message, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    """Hand a worker's result to the orchestrator (the last line on stdout)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any]:
    """The result a worker printed; raise naming what it printed otherwise."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            doc: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return doc
    tail = "\n".join(stdout.splitlines()[-5:])
    raise RuntimeError(f"worker printed no result; its last lines:\n{tail}")


#: Fields of the ``cpu`` line of /proc/stat, in order (jiffies since boot).
_PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_times() -> dict[str, int] | None:
    """The machine's CPU time by kind (/proc/stat), or None where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            first = stat.readline().split()
    except OSError:
        return None
    return dict(zip(_PROC_STAT_FIELDS, map(int, first[1:9]), strict=False))


def machine_share(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, float]:
    """Percent of the machine's CPU time per kind between two :func:`machine_times`;
    ``steal`` is time the hypervisor gave to other guests (a noisy neighbour)."""
    if not before or not after:
        return {}
    delta = {k: after[k] - before.get(k, 0) for k in after}
    total = sum(delta.values())
    if total <= 0:
        return {}
    return {k: round(100 * v / total, 1) for k, v in delta.items()}


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0 < fraction <= 1)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return float(sorted_values[rank - 1])


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, p50, p95, p99, max and mean of ``values`` (milliseconds, say)."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "p50": round(percentile(ordered, 0.50), 2),
        "p95": round(percentile(ordered, 0.95), 2),
        "p99": round(percentile(ordered, 0.99), 2),
        "max": round(ordered[-1], 2),
        "mean": round(sum(ordered) / len(ordered), 2),
    }


def cdf_points(values: Sequence[float], points: int = 200) -> list[tuple[float, float]]:
    """(value, fraction at or below) at ``points`` evenly spaced ranks, for plots."""
    ordered = sorted(values)
    if not ordered:
        return []
    n = len(ordered)
    step = max(1, n // points)
    out = [(ordered[i], (i + 1) / n) for i in range(0, n, step)]
    if out[-1][1] < 1.0:
        out.append((ordered[-1], 1.0))
    return out


async def stream_span(js: JetStreamContext, stream: str) -> tuple[float, float, int]:
    """Wall-clock seconds of the stream's first and last stored message, and its count.

    A drain's rate is its message count over this span: it starts at the first message
    stored, so the writer's process start-up is not counted, and it is read from the
    server, the same way for every writer measured.
    """
    info = await js.stream_info(stream)
    if not info.state.messages:
        return 0.0, 0.0, 0
    first = await js.get_msg(stream, info.state.first_seq)
    last = await js.get_msg(stream, info.state.last_seq)
    if first.time is None or last.time is None:
        raise RuntimeError(f"stream {stream}: the server returned no message timestamps")
    return first.time.timestamp(), last.time.timestamp(), int(info.state.messages)


async def fetch(dsn: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """The rows of ``query``, on a connection of its own."""
    conn = await asyncpg.connect(dsn)
    try:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args)
        return rows
    finally:
        await conn.close()


def fail(message: str) -> None:
    """Stop a worker with a message on stderr (exit code 2)."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(2)
