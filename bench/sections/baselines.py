"""The raw baselines: JetStream publish and consume, the state+outbox transaction, POST
/handle, a bare aiohttp server; two of them again at the run's end."""

from __future__ import annotations

import time
from typing import Any

from bench.books import cpu_delta
from bench.common import say
from bench.procs import PYTHON, run_worker
from bench.sections.base import Bench


async def baselines(bench: Bench) -> None:
    """Raw JetStream publish and consume, the PostgreSQL transaction, the HTTP round trip."""
    opts, res = bench.options, bench.results
    say(f"baselines: JetStream publish/consume of {opts.rows:,}, PostgreSQL and HTTP for "
        f"{opts.baseline_seconds:.0f}s each")  # fmt: skip
    details: dict[str, Any] = {}
    async with bench.deployment("sea-vibespro", "off", "baseline") as dep:
        url = bench.servers.nats.url
        jobs: list[tuple[str, list[str]]] = [
            ("js-publish", ["--nats-url", url, "--rows", str(opts.rows)]),
            ("js-consume", ["--nats-url", url, "--rows", str(opts.rows)]),
            ("pg-txn", ["--dsn", dep.dsn("sea"), "--seconds", str(opts.baseline_seconds)]),
        ]
        for kind, args in jobs:
            details[kind] = await run_baseline(bench, kind, args)
        handler_url = await dep.start_handler("vibespro")
        args = ["--url", handler_url, "--seconds", str(opts.baseline_seconds)]
        details["http-handler"] = await run_baseline(bench, "http-handler", args)
        echo_args = ["--seconds", str(opts.baseline_seconds)]
        details["http-echo"] = await run_baseline(bench, "http-echo", echo_args)
    res.sections["baselines"] = details
    rows = [
        ("raw.js_publish", "raw JetStream publish, pipelined, unique Nats-Msg-Id", "msg/s",
         details["js-publish"]["msg_s"]),
        ("raw.js_consume", "raw JetStream pull consume + ack (batch 50)", "msg/s",
         details["js-consume"]["msg_s"]),
        ("raw.pg_txn", "raw PostgreSQL state+outbox transaction, 8 connections", "txn/s",
         details["pg-txn"]["txn_s"]),
        ("raw.http", "raw HTTP POST /handle to the example handler, 64 in flight", "req/s",
         details["http-handler"]["req_s"]),
        ("raw.http_echo", "raw HTTP POST round trip to a bare aiohttp server, 64 in flight",
         "req/s", details["http-echo"]["req_s"]),
    ]  # fmt: skip
    for key, label, unit, value in rows:
        res.row(key, label, unit).set("raw", value)


#: The baselines measured again at the run's end (``baselines again``): the raw POST
#: /handle every drain ratio divides by, and the state+outbox transaction behind every
#: producer. Key of the row at the end, key of the same measurement at the start.
AGAIN = (("raw.pg_txn_end", "raw.pg_txn", "pg-txn", "txn_s"),
         ("raw.http_end", "raw.http", "http-handler", "req_s"))  # fmt: skip


async def baselines_again(bench: Bench) -> None:
    """Two baselines measured again after every other section, beside their first figures.

    The VM's speed drifts over a 30-minute run (other tenants): the same measurement at
    both ends says how far a late section may be off from a baseline taken first, so a
    reader knows how much of a ratio is the machine. Each row's ratio is end ÷ start.
    """
    opts, res = bench.options, bench.results
    say(f"baselines again at the run's end: PostgreSQL and HTTP for "
        f"{opts.baseline_seconds:.0f}s each")  # fmt: skip
    details: dict[str, Any] = {}
    async with bench.deployment("sea-vibespro", "off", "baseline-end") as dep:
        seconds = ["--seconds", str(opts.baseline_seconds)]
        details["pg-txn"] = await run_baseline(
            bench, "pg-txn", ["--dsn", dep.dsn("sea"), *seconds], label="raw pg-txn, end"
        )
        handler_url = await dep.start_handler("vibespro")
        details["http-handler"] = await run_baseline(
            bench, "http-handler", ["--url", handler_url, *seconds], label="raw http-handler, end"
        )
    res.sections["baselines_end"] = details
    drift: dict[str, float] = {}
    for key, start_key, kind, field_name in AGAIN:
        start = next((r for r in res.rows if r.key == start_key), None)
        label = f"{start.label if start else kind}, measured again at the run's end"
        row = res.row(key, label, start.unit if start else "/s")
        row.set("raw", float(details[kind][field_name]))
        first = start.values.get("raw") if start else None
        if first:
            row.baseline, row.baseline_label = first, "the same measurement at the run's start"
            drift[start_key] = round(float(details[kind][field_name]) / first - 1, 3)
            row.notes.append(f"end ÷ start {details[kind][field_name] / first:.2f}: the "
                             f"machine's drift over the run")  # fmt: skip
    res.meta["baseline_drift"] = drift
    if drift:
        say("  drift over the run: " + ", ".join(
            f"{k} {100 * v:+.0f} %" for k, v in drift.items()))  # fmt: skip


async def run_baseline(
    bench: Bench, kind: str, args: list[str], *, label: str | None = None
) -> dict[str, Any]:
    """Run one raw baseline worker; its CPU is booked as ``label`` (``raw <kind>``)."""
    book = bench.servers.book
    before = book.snapshot()
    started = time.monotonic()
    result = await run_worker(kind, [PYTHON, "-m", "bench.baselines", kind, *args],
                              bench_env())  # fmt: skip
    elapsed = time.monotonic() - started
    cpu = cpu_delta(before, book.snapshot())
    cpu["raw client"] = float(result.get("cpu_s", 0.0))
    count = int(result.get("count", 0))
    bench.results.book_cpu(label or f"raw {kind}", "raw", count, min(elapsed, result["seconds"]),
                           cpu)  # fmt: skip
    result["cpu_s_by_process"] = cpu
    rate = result.get("msg_s") or result.get("txn_s") or result.get("req_s")
    say(f"  {kind}: {rate:,.0f}/s")
    return result


def bench_env() -> dict[str, str]:
    from bench.procs import clean_environ

    return clean_environ()
