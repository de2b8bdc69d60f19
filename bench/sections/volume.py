"""A year in the life (issue 48): every hot path on empty tables, then at volume.

Two deployments of sea-vibespro, one after the other in the same run: the first on empty
tables, the second after :mod:`bench.volume_seed` filled its databases with a year of
the ``vibespro__from_sea`` lane's history (``--volume-scale`` times the issue's sizes:
10 million inbox rows, 2 million outbox rows, 200,000 dead letters with their actions,
100,000 parked events behind 1,000 held heads, a set-aside outbox row with 50,000 rows
behind it, a million claims). On each, in order:

``drainer round``  the ordered drainer's round (its ready keys and next due, what
                   services.inbox_consumer.ordering_drain asks each round), median of 20
``publisher``      the outbox-publisher draining ``--rows`` into the stream, alone
``consumer``       then one consumer (and the example handler) draining those messages
                   from the stream into the inbox: first claim to last processed
``p99 at 600``     the end-to-end p99 at 600 msg/s for ``--seconds`` (the latency step)
``overview``,      the console's pages over HTTP, through its own process, signed in:
``failures``       median of 7 GETs after one
``ferry where``    the command's lookup (:func:`shared.ops.where.journey`) of an event of
                   the drains, median of 7

Each figure at volume over its empty figure is judged against the issue's target (a
rate at least 1 / 1.2 of it, a time at most 1.2 x); the console pages at volume must
also take under 1 s and ``ferry where`` under 200 ms.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import aiohttp
import asyncpg

from bench.books import cpu_delta
from bench.common import say, stream_span, summarize
from bench.procs import PYTHON, spawn, wait_http
from bench.report import Target
from bench.sections.base import SEA_DURABLE, SEA_STREAM, Bench, ferry_row, processed, wait_for
from bench.sections.drains import commit_backlog
from bench.sections.steps import committed, run_step, sea_lane, sea_latencies
from bench.volume_seed import Lane, Sizes, seed
from bench.world import Deployment
from devstack.ports import free_port
from services.console.auth import hash_password
from shared.adapters import parking
from shared.ops.where import journey
from shared.runtime.settings import CommonSettings

#: The issue's targets: each hot path within 1.2 x of its empty figure; the console's
#: pages under 1 s and ``ferry where`` under 200 ms at volume.
SLOWER = 1.2
PAGE_MS = 1000.0
WHERE_MS = 200.0
LATENCY_RATE = 600
#: Requests (or rounds) timed per figure, after one untimed warm-up.
REPEATS = 7
ROUNDS = 20
#: The drainer's key limit with the consumer's default concurrency (ordering_drain).
READY_LIMIT = 32
CONSOLE_PASSWORD = "volume-bench-1"


async def volume(bench: Bench, mode: str) -> None:
    """Every hot path on empty tables, then on a seeded year; the rows and their verdicts."""
    sizes = Sizes().scaled(bench.options.volume_scale)
    empty = await phase(bench, mode, None)
    full = await phase(bench, mode, sizes)
    doc = {"sizes": vars(sizes), "empty": empty, "volume": full}
    bench.results.sections.setdefault("volume", {})[mode] = doc
    for label, figures in (("empty", empty), ("volume", full)):
        check(bench, label, figures)
    book_rows(bench, mode, empty, full)


def check(bench: Bench, label: str, figures: dict[str, Any]) -> None:
    """An error for every count that falls short: a figure of a partial drain is no figure."""
    rows, problems = bench.options.rows, []
    if figures["publisher"]["in_stream"] != rows:
        problems.append(f"{figures['publisher']['in_stream']:,} of {rows:,} published")
    if figures["consumer"]["processed"] != rows:
        problems.append(f"{figures['consumer']['processed']:,} of {rows:,} processed")
    if figures["latency"]["unprocessed"]:
        problems.append(f"{figures['latency']['unprocessed']:,} unprocessed after the step")
    if problems:
        bench.results.errors.append(f"volume [{label}]: " + "; ".join(problems))


async def phase(bench: Bench, mode: str, sizes: Sizes | None) -> dict[str, Any]:
    """One deployment: seeded with ``sizes`` (None: empty), then every figure measured."""
    label = "volume" if sizes else "empty"
    figures: dict[str, Any] = {}
    async with bench.deployment("sea-vibespro", mode, f"volume-{label}") as dep:
        lane = Lane.of(dep.topology, SEA_DURABLE, dep.dsn)
        if sizes is not None:
            say(f"volume: seeding {sizes.total():,} rows of a year's history")
            seeded = await seed(lane, sizes, say=say)
            figures["seeded"] = {"seconds": seeded.seconds, "rows": seeded.rows(),
                                 "tables": seeded.tables}  # fmt: skip
            say(f"  seeded {seeded.rows():,} rows in {seeded.seconds:.0f}s")
        say(f"volume [{label}]: the drainer's round")
        figures["drainer_round_ms"] = await drainer_round(lane.target_dsn)
        figures["publisher"] = await publisher_drain(bench, dep, mode)
        figures["consumer"] = await consumer_drain(bench, dep, figures["publisher"]["since"])
        figures["latency"] = await latency(bench, dep)
        figures["pages"] = await console_pages(bench, dep)
        event = await an_event(dep, figures["publisher"]["since"])
        figures["where_ms"] = await where_lookup(bench, dep, event)
    figures["publisher"]["since"] = figures["publisher"]["since"].isoformat()
    return figures


async def timed(what: Callable[[], Awaitable[Any]], repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``what``, after one untimed call."""
    await what()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await what()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def drainer_round(dsn: str) -> float:
    """The ordered drainer's round on the lane's parked events (partition 0)."""
    conn = await asyncpg.connect(dsn)
    try:

        async def round_() -> None:
            await parking.ready_keys(conn, SEA_DURABLE, 0, READY_LIMIT)
            await parking.next_due(conn, SEA_DURABLE, 0)

        return await timed(round_, ROUNDS)
    finally:
        await conn.close()


async def publisher_drain(bench: Bench, dep: Deployment, mode: str) -> dict[str, Any]:
    """The publisher alone emptying ``--rows`` into its (fresh) stream."""
    rows = bench.options.rows
    say(f"  publisher drain of {rows:,} rows")
    await dep.start_publisher("sea")
    nc = await bench.servers.connect_nats()
    js = nc.jetstream()
    conn = await asyncpg.connect(dep.dsn("sea"))
    try:
        since = await conn.fetchval("SELECT now()")
        before, _ = await commit_backlog(bench, conn, rows, mode)

        async def stored() -> int:
            return int((await js.stream_info(SEA_STREAM)).state.messages)

        await wait_for("published", stored, rows, bench.options.drain_budget)
        cpu = cpu_delta(before, bench.servers.book.snapshot())
        first, last, count = await stream_span(js, SEA_STREAM)
    finally:
        await conn.close()
        await nc.close()
    rate = count / max(last - first, 1e-3)
    say(f"    {rate:,.0f} msg/s ({count:,} in the stream)")
    return {"rows": rows, "in_stream": count, "msg_s": rate, "cpu_s": cpu, "since": since}


async def consumer_drain(bench: Bench, dep: Deployment, since: datetime) -> dict[str, Any]:
    """One consumer and the example handler emptying the stream into the inbox."""
    rows = bench.options.rows
    say(f"  consumer drain of {rows:,} messages")
    before = bench.servers.book.snapshot()
    url = await dep.start_handler("vibespro")
    await dep.start_consumer(SEA_DURABLE, url)
    target = await asyncpg.connect(dep.dsn("vibespro"))
    try:
        await wait_for(
            "processed", lambda: processed(target, SEA_DURABLE, since), rows,
            bench.options.drain_budget,
        )  # fmt: skip
        cpu = cpu_delta(before, bench.servers.book.snapshot())
        span = await target.fetchrow(
            "SELECT count(*) AS done, extract(epoch FROM max(processed_at) - min(received_at))"
            " AS seconds FROM inbox_messages WHERE durable = $1 AND status = 'processed'"
            " AND occurred_at >= $2", SEA_DURABLE, since,
        )  # fmt: skip
    finally:
        await target.close()
    assert span is not None
    done, seconds = int(span["done"]), float(span["seconds"] or 0.0)
    rate = done / max(seconds, 1e-3)
    say(f"    {rate:,.0f} msg/s ({done:,} processed)")
    return {"rows": rows, "processed": done, "msg_s": rate, "seconds": seconds, "cpu_s": cpu}


async def latency(bench: Bench, dep: Deployment) -> dict[str, Any]:
    """The end-to-end latency at 600 msg/s for ``--seconds`` (the latency section's step)."""
    seconds = bench.options.seconds
    say(f"  latency at {LATENCY_RATE} msg/s for {seconds:.0f}s")
    source, target = dep.dsn("sea"), dep.dsn("vibespro")

    async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
        return await sea_latencies(source, target, since)

    step = await run_step(bench, dep, [sea_lane(dep, LATENCY_RATE)], seconds, measure,
                          committed)  # fmt: skip
    stats = summarize(step.latencies["processed"])
    lane = step.producer["lanes"][0]
    say(f"    p50 {stats.get('p50', 0):.1f}  p99 {stats.get('p99', 0):.1f} ms "
        f"(producer {lane['achieved']:,.0f}/s, unprocessed {step.unprocessed})")  # fmt: skip
    return {"latency_ms": stats, "achieved": lane["achieved"], "unprocessed": step.unprocessed,
            "started_busy": step.started_busy}  # fmt: skip


async def console_pages(bench: Bench, dep: Deployment) -> dict[str, float]:
    """Median milliseconds of the console's overview and failures pages, signed in."""
    accounts = bench.servers.base / f"{dep.prefix}-accounts.json"
    accounts.write_text(json.dumps(
        {"ops": {"role": "operator", "password": hash_password(CONSOLE_PASSWORD)}}
    ))  # fmt: skip
    port = free_port()
    env = dep.role_env(FERRY_CONSOLE_PORT=str(port), FERRY_CONSOLE_ACCOUNTS_FILE=str(accounts),
                       FERRY_CONSOLE_SAMPLE_INTERVAL="3600")  # fmt: skip
    proc = await spawn(f"{dep.label}-console", "console", [PYTHON, "-m", "services.console"],
                       env, bench.logs)  # fmt: skip
    dep.procs.append(proc)  # stopped with the deployment's roles
    url = f"http://127.0.0.1:{port}"
    await wait_http(f"{url}/readyz", proc)
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
    async with aiohttp.ClientSession(cookie_jar=jar) as session:
        login = {"user": "ops", "password": CONSOLE_PASSWORD, "next": "/"}
        async with session.post(f"{url}/login", data=login) as resp:
            resp.raise_for_status()

        def page(path: str) -> Callable[[], Awaitable[None]]:
            async def get() -> None:
                async with session.get(f"{url}{path}") as resp:
                    resp.raise_for_status()
                    await resp.read()

            return get

        pages = {name: await timed(page(path), REPEATS)
                 for name, path in (("overview", "/"), ("failures", "/failures"))}  # fmt: skip
    say(f"  console: overview {pages['overview']:.0f} ms, failures {pages['failures']:.0f} ms")
    return pages


async def an_event(dep: Deployment, since: datetime) -> uuid.UUID:
    """An event of the drains (its outbox row, inbox row and claim written just now)."""
    conn = await asyncpg.connect(dep.dsn("sea"))
    try:
        found = await conn.fetchval(
            "SELECT id FROM outbox_events WHERE occurred_at >= $1 ORDER BY seq LIMIT 1", since
        )
    finally:
        await conn.close()
    return uuid.UUID(str(found))


async def where_lookup(bench: Bench, dep: Deployment, event: uuid.UUID) -> float:
    """Median milliseconds of ``ferry where``'s lookup of ``event``."""
    databases = {d: bench.servers.pg.dsn(d) for d in dep.topology.databases()}
    settings = CommonSettings(topology=dep.path, nats_url=bench.servers.nats.url,
                              databases=databases)  # fmt: skip
    nc = await bench.servers.connect_nats()
    try:

        async def look() -> None:
            doc = await journey(settings, dep.topology, event, nc)
            if not doc["found"]:
                raise RuntimeError(f"ferry where: {event} not found")

        ms = await timed(look, REPEATS)
    finally:
        await nc.close()
    say(f"  ferry where: {ms:.0f} ms")
    return ms


# --------------------------------------------------------------------------- the rows


def figures_of(doc: dict[str, Any]) -> dict[str, float]:
    """The judged figures of one phase, by key."""
    return {
        "publisher": doc["publisher"]["msg_s"],
        "consumer": doc["consumer"]["msg_s"],
        "p99": doc["latency"]["latency_ms"].get("p99", float("nan")),
        "overview": doc["pages"]["overview"],
        "failures": doc["pages"]["failures"],
        "where": doc["where_ms"],
        "drainer": doc["drainer_round_ms"],
    }


#: key → (label, unit, higher is better).
FIGURES = {
    "publisher": ("outbox-publisher drain", "msg/s", True),
    "consumer": ("consumer drain (stream → inbox → handler)", "msg/s", True),
    "p99": (f"end-to-end p99 at {LATENCY_RATE} msg/s", "ms", False),
    "overview": ("console overview page", "ms", False),
    "failures": ("console failures page", "ms", False),
    "where": ("ferry where (the lookup)", "ms", False),
    "drainer": ("ordered drainer's round (ready keys, next due)", "ms", False),
}
#: Absolute targets at volume, beside the ratio.
LIMITS = {"overview": PAGE_MS, "failures": PAGE_MS, "where": WHERE_MS}


def book_rows(bench: Bench, mode: str, empty: dict[str, Any], full: dict[str, Any]) -> None:
    """A row per figure: at volume, its baseline the empty figure, the ratio judged; and
    the absolute targets. Prints the section's own table."""
    before, after = figures_of(empty), figures_of(full)
    lines = [f"{'figure':<50}{'empty':>10}{'at volume':>11}{'ratio':>7}  {'target':<16}verdict"]
    for key, (label, unit, higher) in FIGURES.items():
        target = (Target(">=", 1 / SLOWER, f"≥ {1 / SLOWER:.2f} x empty", ratio=True) if higher
                  else Target("<=", SLOWER, f"≤ {SLOWER} x empty", ratio=True))  # fmt: skip
        row = ferry_row(bench, f"volume.{key}", f"at volume: {label}", unit, target=target)
        row.baseline, row.baseline_label = before[key], f"the same on empty tables ({unit})"
        row.set(mode, after[key])
        lines.append(_line(label, unit, before[key], after[key], row.target, row.judged(mode)))
        if key in LIMITS:
            limit = Target("<", LIMITS[key], f"< {LIMITS[key]:,.0f} ms")
            absolute = ferry_row(bench, f"volume.{key}_limit", f"at volume: {label}, limit",
                                 unit, target=limit)  # fmt: skip
            absolute.set(mode, after[key])
            lines.append(_line(f"{label}, limit", unit, None, after[key], limit,
                               absolute.judged(mode)))  # fmt: skip
    _notes(bench, mode, full)
    say("volume: empty against a year of history\n" + "\n".join(lines))


def _line(label: str, unit: str, empty: float | None, full: float, target: Target | None,
          verdict: str) -> str:  # fmt: skip
    ratio = f"{full / empty:.2f}" if empty else ""
    shown = f"{empty:,.1f}" if empty is not None else ""
    text = target.text if target else ""
    return (f"{label + f' ({unit})':<50}{shown:>10}{full:>11,.1f}{ratio:>7}  {text:<16}"
            f"{verdict}")  # fmt: skip


def _notes(bench: Bench, mode: str, full: dict[str, Any]) -> None:
    seeded = full.get("seeded") or {}
    row = ferry_row(bench, "volume.publisher", "", "")
    note = (f"at volume: {seeded.get('rows', 0):,} rows of history seeded in "
            f"{seeded.get('seconds', 0):.0f}s (results.json: per table)")  # fmt: skip
    if note not in row.notes:
        row.notes.append(note)
    if full["latency"]["unprocessed"]:
        ferry_row(bench, "volume.p99", "", "").notes.append(
            f"tracing {mode}: {full['latency']['unprocessed']:,} events not processed in time"
        )
