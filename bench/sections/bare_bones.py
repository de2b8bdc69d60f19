"""The bare-bones pipeline (bench/prototype.py) at the latency section's loads: the
yardstick of the latency and sustained rows; and its per-message backlog drain beside a
raw POST to its own handler, the floor of the per-message drain target."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import asyncpg
import nats

from bench.books import cpu_delta
from bench.common import fetch, say, stream_span
from bench.procs import PYTHON, spawn
from bench.ratios import PROTO_DRAIN_KEY, proto_book
from bench.sections.base import SEA_STREAM, Bench, wait_for
from bench.sections.baselines import run_baseline
from bench.sections.drains import commit_backlog
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

        await _floor(bench, dep, url)

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
                            what=proto_book(rate))  # fmt: skip
        if "sustained" in opts.sections:
            # The baseline of Ferry's sustained rate: the same search, on the same box.
            await sustained(bench, dep, "raw", measure, bare_bones=True)


#: Rows of the table the floor makes.
PROTO_POST_KEY = "raw.proto_http"


async def _floor(bench: Bench, dep: Deployment, url: str) -> None:
    """The bare-bones pipeline's per-message drain over a raw POST to its own handler.

    Ferry's per-message drain is judged against a raw ``POST /handle`` to the example
    handler (≥ 0.8 x). The same ratio for the least code that moves an outbox row to a
    handler, on the same box and servers, says what the pipeline itself leaves of a
    handler's raw rate: the floor beneath that target. The drain is the same scattered
    backlog as Ferry's drains (``--rows``), timed the same way: from the first message
    stored to the last one processed.
    """
    opts = bench.options
    seconds = ["--seconds", str(opts.baseline_seconds)]
    post = await run_baseline(bench, "http-handler", ["--url", url, *seconds],
                              label="raw http bare-bones handler")  # fmt: skip
    post_row = bench.results.row(
        PROTO_POST_KEY, "raw HTTP POST /handle to the bare-bones handler, 64 in flight", "req/s"
    )
    post_row.set("raw", float(post["req_s"]))
    rows = opts.rows
    say(f"bare-bones pipeline: drain of {rows:,} events, one call per event")
    nc = await nats.connect(bench.servers.nats.url)
    source = await asyncpg.connect(dep.dsn("sea"))
    target = await asyncpg.connect(dep.dsn("vibespro"))
    try:
        before, started = await commit_backlog(bench, source, rows, "off", scattered=True)
        done = await wait_for("processed", lambda: _proto_processed(target), rows,
                              opts.drain_budget)  # fmt: skip
        cpu = cpu_delta(before, bench.servers.book.snapshot())
        first, _, _ = await stream_span(nc.jetstream(), SEA_STREAM)
        last = await target.fetchval(
            "SELECT extract(epoch FROM max(processed_at)) FROM proto_inbox"
        )
    finally:
        await target.close()
        await source.close()
        await nc.close()
    rate = done / max(float(last or 0.0) - first, 1e-3)
    label = f"bare-bones pipeline drain, {rows:,} events, per-message calls"
    bench.results.book_cpu(label, "raw", done, time.monotonic() - started, cpu)
    bench.results.sections["proto_drain"] = {
        "rows": rows, "processed": done, "msg_s": rate, "post_req_s": post["req_s"],
        "post_statuses": post.get("statuses", {}), "cpu_s": cpu,
    }  # fmt: skip
    row = bench.results.row(PROTO_DRAIN_KEY, f"{label} (÷ raw POST to its handler)", "msg/s")
    row.set("raw", rate)
    row.baseline, row.baseline_label = post_row.values["raw"], "raw POST /handle to its handler"
    if done < rows:
        row.notes.append(f"partial: {done:,} of {rows:,} processed when the --drain-budget "
                         "ran out")  # fmt: skip
    row.notes.append("the floor of the per-message drain target: what the least pipeline "
                     "leaves of its handler's raw rate on this box")  # fmt: skip
    say(f"  bare-bones drain: {rate:,.0f} msg/s, raw POST to its handler "
        f"{post['req_s']:,.0f} req/s")  # fmt: skip


async def _proto_processed(conn: asyncpg.Connection) -> int:
    query = "SELECT count(*) FROM proto_inbox WHERE processed_at IS NOT NULL"
    return int(await conn.fetchval(query))


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
    records = await fetch(
        target_dsn,
        "SELECT extract(epoch FROM i.processed_at - i.occurred_at) * 1000 AS processed,"
        " extract(epoch FROM a.applied_at - i.occurred_at) * 1000 AS applied,"
        " extract(epoch FROM i.received_at - i.occurred_at) * 1000 AS received"
        " FROM proto_inbox i LEFT JOIN proto_applied a USING (id)"
        " WHERE i.processed_at IS NOT NULL AND i.occurred_at >= $1",
        since,
    )
    published = await fetch(
        source_dsn,
        "SELECT extract(epoch FROM published_at - occurred_at) * 1000 AS published"
        " FROM outbox_events WHERE occurred_at >= $1 AND published_at IS NOT NULL",
        since,
    )
    out = {
        "processed": [float(r["processed"]) for r in records],
        "applied": [float(r["applied"]) for r in records if r["applied"] is not None],
        "published": [float(r["published"]) for r in published],
        "received": [float(r["received"]) for r in records],
    }
    return out, len(records)
