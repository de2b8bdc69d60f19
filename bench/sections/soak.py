"""Resident memory of every role over a long run at a steady rate."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from bench.common import say, summarize
from bench.report import Target
from bench.sections.base import SEA_DURABLE, Bench, ferry_row
from bench.sections.steps import committed, run_step, sea_lane, sea_latencies
from shared.waits import sleep_unless


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

        step = await run_step(bench, dep, [sea_lane(dep, rate)], seconds, measure, committed)
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
