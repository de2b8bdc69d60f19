"""The bare-bones pipeline (bench/prototype.py) at the latency section's loads: the
yardstick of the latency and sustained rows."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import asyncpg

from bench.common import say
from bench.procs import PYTHON, spawn
from bench.sections.base import Bench
from bench.sections.latency import record_latency, sustained
from bench.sections.steps import committed, run_step, sea_lane
from bench.world import Deployment
from devstack.ports import free_port


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
        await run_step(bench, dep, [sea_lane(dep, 200)], opts.warmup_seconds, measure,
                       committed)  # fmt: skip
        for rate in opts.rates:
            say(f"bare-bones pipeline at {rate:,} msg/s offered for {opts.seconds:.0f}s")
            step = await run_step(bench, dep, [sea_lane(dep, rate)], opts.seconds, measure,
                                  committed)  # fmt: skip
            record_latency(bench, "raw", f"bare-bones {rate:,} msg/s", f"raw.proto_{rate}",
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
