"""faststream-outbox, the closest Python peer, draining the same kind of backlog."""

from __future__ import annotations

import time

import asyncpg
import nats

from bench import ratios
from bench.books import cpu_delta
from bench.common import say
from bench.procs import PYTHON, run_worker
from bench.report import Results
from bench.sections.base import Bench
from bench.sections.baselines import bench_env


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
