"""The database and every role over a long run with retention shortened to minutes (issue 48).

Every retention of the topology (outbox, inbox, claims, audit) is cut to
``--soak-retention`` seconds and the retention role runs beside the pipeline
(``ferry purge --every``, a quarter of the retention), so a run of an hour lives through
many lifetimes of each row. What a year in production needs is that nothing grows once
the first retention has passed: the figures are the growth of each database's size and
of each role's resident memory over the second half of the run (≤ 5 %), sampled
throughout and drawn as a plot of table sizes over time (``retention-soak.png``).

Counted against independent records, not the tables being purged: every event the
producer committed is in the stream and acknowledged by the consumer (JetStream's own
counts). Latency is read every sample from the rows processed since the last one, before
the purge can reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from bench.common import say, summarize
from bench.report import Target
from bench.sections.base import SEA_DURABLE, Bench, ferry_row
from bench.sections.steps import committed, run_step, sea_lane
from bench.world import Deployment
from shared.waits import sleep_unless

#: The settings cut to the soak's retention, in every context.
RETENTIONS = ("outbox_retention", "inbox_retention", "claims_retention", "audit_retention")
#: The tables drawn (the ones the pipeline writes at its rate).
DRAWN = ("outbox_events", "inbox_messages", "handler_applied", "handler_calls")
#: The sizes of one database: each drawn table's (with its indexes and TOAST), and all.
_SIZES = """
SELECT t.name, coalesce(pg_total_relation_size(to_regclass(t.name)), 0) AS bytes
FROM unnest($1::text[]) AS t(name)
UNION ALL SELECT '*', pg_database_size(current_database())
"""
_LATENCIES = """
SELECT extract(epoch FROM processed_at - occurred_at) * 1000 AS ms,
       extract(epoch FROM processed_at) AS at
FROM inbox_messages
WHERE durable = $1 AND status = 'processed' AND processed_at >= $2 AND processed_at < $3
"""
#: Growth over the second half the run may show (issue 48).
GROWTH_LIMIT = 5.0


#: The shortest retention the soak runs with: ``ferry lint`` wants the streams' duplicate
#: window past the publisher's re-publish horizon (71 s with the defaults), so the streams
#: keep messages 90 s, and every retention at least that.
SHORTEST = 120.0


def shorten(keep: float) -> Any:
    """A topology patch: every context keeps everything ``keep`` seconds, and every way a
    copy can still arrive is shortened to fit, as ``ferry lint`` requires (the roles
    refuse a topology whose claims or inbox rows would go before a copy could come): the
    streams keep messages three quarters of it (a consumer further behind than that loses
    what expires: the soak counts it), their duplicate window 90 s, the dead-letter streams
    30 s, a durable redelivers within seconds (``ack_wait`` 5 s, 3 deliveries) and replays
    only by an operator."""
    max_age = f"{max(90.0, keep * 0.75):g}s"

    def patch(doc: dict[str, Any]) -> None:
        for ctx in doc["contexts"].values():
            for name in RETENTIONS:
                ctx[name] = f"{keep:g}s"
            if ctx.get("stream"):
                ctx["stream"].update(max_age=max_age, duplicate_window="90s")
        for stream in doc.get("dead_letter_streams", []):
            stream["max_age"] = "30s"
        for durable in doc["durables"].values():
            durable.update(ack_wait="5s", max_deliver=3, backoff=["1s", "2s"], replay="operator")
            durable["handler"]["timeout"] = "5s"

    return patch


async def retention_soak(bench: Bench, mode: str) -> None:
    """Database sizes and resident memory over ``--soak-seconds`` with short retention."""
    opts = bench.options
    seconds, rate, keep = opts.soak_seconds, opts.soak_rate, opts.soak_retention
    every = max(keep / 4, 5.0)
    say(f"retention soak: {rate:,} msg/s for {seconds:.0f}s, everything kept {keep:g}s, "
        f"purged every {every:g}s from {2 * keep:g}s in, tracing {mode}")  # fmt: skip
    if seconds < 6 * keep:
        say(f"  note: {seconds:.0f}s is under 6 x the retention: the second half starts "
            "before the tables can have settled")  # fmt: skip
    rows = _rows(bench, seconds, rate, keep)
    deployment = bench.deployment("sea-vibespro", mode, f"retsoak-{mode}", patch=shorten(keep))
    async with deployment as dep:
        handler_url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, handler_url)
        await dep.start_publisher("sea")
        sampler = Sampler(bench, dep, max(seconds / 120, 1.0))
        task = asyncio.create_task(sampler.run())
        # The purge starts late, with a retention's worth of rows (each table's) past due:
        # its first run, while the pipeline runs on, is the purge rate under load.
        first = asyncio.create_task(_first_purge(dep, sampler, 2 * keep, every))
        try:
            step = await run_step(bench, dep, [sea_lane(dep, rate)], seconds,
                                  sampler.measure(Acked(bench, dep)), committed)  # fmt: skip
            settled = await consumer_settled(dep)
        finally:
            sampler.stop.set()
            await task
            purge = await first
    samples = sampler.samples
    db_growth = second_half_growth([s["bytes"] for s in samples])
    rss_growth = second_half_growth([s["rss"] for s in samples])
    rows["db"].set(mode, max(db_growth.values(), default=float("nan")))
    rows["rss"].set(mode, max(rss_growth.values(), default=float("nan")))
    # Rows written per second by the pipeline: one per event in each drawn table.
    written = rate * len(DRAWN)
    purge_ratio = purge["rows"] / purge["seconds"] / written if purge.get("seconds") else None
    # Before any purge (after a warm-up) against the rest of the run, the purge running.
    quiet = sampler.p99(sampler.began + 10.0, purge.get("started"))
    busy = sampler.p99(purge.get("started"), None)
    p99_ratio = busy / quiet if busy and quiet else None
    if purge_ratio is not None:
        rows["purge"].set(mode, round(purge_ratio, 2))
    if p99_ratio is not None:
        rows["p99"].set(mode, round(p99_ratio, 2))
    made = committed(step.producer)
    missing = made - settled
    bench.results.sections.setdefault("retention_soak", {})[mode] = {
        "rate": rate, "seconds": seconds, "retention_seconds": keep, "purge_every": every,
        "committed": made, "acknowledged": made - step.unprocessed,
        "settled_by_the_consumer": settled, "missing": missing,
        "db_growth_percent": db_growth, "rss_growth_percent": rss_growth,
        "first_purge": purge, "purge_rate_vs_writes": purge_ratio,
        "p99_before_purge_ms": quiet, "p99_with_purge_ms": busy,
        "latency_ms": summarize(sampler.latencies), "samples": samples,
    }  # fmt: skip
    say("  second-half growth: databases "
        + ", ".join(f"{n} {g:+.1f} %" for n, g in db_growth.items())
        + "; roles " + ", ".join(f"{n} {g:+.1f} %" for n, g in rss_growth.items()))  # fmt: skip
    if purge.get("seconds"):
        say(f"  first purge under load: {purge['rows']:,} rows in {purge['seconds']:.2f}s "
            f"({purge['rows'] / purge['seconds']:,.0f} rows/s, {purge_ratio:.1f} x the "
            f"{written:,} rows/s written)")  # fmt: skip
    if busy and quiet:
        say(f"  p99 {quiet:.0f} ms before the retention role started, {busy:.0f} ms after")
    say(
        f"  {made:,} committed; the stream's ack floor passed {made - step.unprocessed:,}; "
        f"the consumer settled {settled:,} (processed or dead-lettered)"
    )
    if missing:
        say(f"  WARNING: {missing:,} committed events were never settled by the consumer: "
            "the pipeline fell further behind than the streams' max_age and they expired "
            "(run at a rate this machine sustains)")  # fmt: skip
    drawn = draw(samples, Path(bench.logs).parent / f"retention-soak-{mode}.png", keep)
    if drawn is not None:
        say(f"  table sizes over time: {drawn}")


#: The consumer's outcomes that settle an event for good, each counted once per event
#: (a duplicate is a copy of an event already settled).
SETTLED = ("processed", "dead_lettered", "exhausted")


async def consumer_settled(dep: Deployment) -> int:
    """Events the consumer settled, by its own count (``ferry_consumer_messages_total``):
    the ack floor also passes messages the stream dropped at their ``max_age``."""
    url = dep.metrics_urls[f"consumer-{SEA_DURABLE}-1"]
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        text = await resp.text()
    return settled_count(text)


def settled_count(text: str) -> int:
    """The settled outcomes of ``ferry_consumer_messages_total`` in a /metrics text."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "ferry_consumer_messages_total"
                    and sample.labels.get("outcome") in SETTLED):  # fmt: skip
                total += sample.value
    return int(total)


def _rows(bench: Bench, seconds: float, rate: int, keep: float) -> dict[str, Any]:
    limit = Target("<=", GROWTH_LIMIT, f"≤ {GROWTH_LIMIT:g} %")
    return {
        "db": ferry_row(bench, "ferry.retention_db_growth",
                        f"database size growth over the second half, {seconds:.0f}s at "
                        f"{rate:,} msg/s, retention {keep:g}s", "%", target=limit),
        "rss": ferry_row(bench, "ferry.retention_rss_growth",
                         "largest resident-memory growth of a role over the second half, "
                         "retention soak", "%", target=limit),
        "purge": ferry_row(bench, "ferry.retention_purge_rate",
                           "first purge under load: rows deleted/s ÷ rows written/s", "x",
                           target=Target(">=", 2.0, "≥ 2 x")),
        "p99": ferry_row(bench, "ferry.retention_p99",
                         "p99 with the retention role running ÷ before it, same run", "x",
                         target=Target("<=", 1.2, "≤ 1.2 x")),
    }  # fmt: skip


async def _first_purge(
    dep: Deployment, sampler: Sampler, delay: float, every: float
) -> dict[str, Any]:
    """Start the retention role ``delay`` seconds into the run; its first run's figures
    (rows purged, seconds, when it started and ended on the sampler's clock)."""
    if await sleep_unless(sampler.stop, delay):
        return {}
    started = time.time()
    await dep.start_retention(every)
    url = dep.metrics_urls["retention"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while not sampler.stop.is_set():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    found = _first_run(await resp.text())
                if found is not None:
                    purged, took, ended = found
                    return {"rows": int(purged), "seconds": took, "started": started,
                            "ended": ended}  # fmt: skip
            await asyncio.sleep(0.5)
    return {"started": started}


def _first_run(text: str) -> tuple[float, float, float] | None:
    """(rows purged, seconds, when it ended) once the retention role has finished a run."""
    purged, took, ended = 0.0, 0.0, 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ferry_retention_purged_rows_total":
                purged += sample.value
            elif sample.name == "ferry_retention_run_duration_seconds":
                took = sample.value
            elif sample.name == "ferry_retention_last_run_timestamp_seconds":
                ended = sample.value
    return (purged, took, ended) if ended > 0 else None


def second_half_growth(series: list[dict[str, float]]) -> dict[str, float]:
    """Per name: the last sample against the one at half time, in percent."""
    if len(series) < 3:
        return {}
    middle, end = series[len(series) // 2], series[-1]
    return {name: round((end[name] - middle[name]) / middle[name] * 100, 1)
            for name in middle if name in end and middle[name]}  # fmt: skip


class Acked:
    """How many of the soak's events the consumer acknowledged: JetStream's ack floor
    (an independent record: the purge deletes the inbox rows, not the stream's counts)."""

    def __init__(self, bench: Bench, dep: Deployment) -> None:
        self.bench, self.dep = bench, dep

    async def count(self) -> int:
        nc = await self.bench.servers.connect_nats()
        try:
            durable = self.dep.topology.durables[SEA_DURABLE]
            (plan,) = self.dep.topology.consumers(SEA_DURABLE)
            info = await nc.jetstream().consumer_info(durable.stream, plan.name)
            return int(info.ack_floor.stream_seq if info.ack_floor else 0)
        finally:
            await nc.close()


class Sampler:
    """Every ``every`` seconds: each database's table sizes, each role's resident memory,
    and the latencies of the events processed since the last sample."""

    def __init__(self, bench: Bench, dep: Deployment, every: float) -> None:
        self.bench, self.dep, self.every = bench, dep, every
        self.samples: list[dict[str, Any]] = []
        self.latencies: list[float] = []
        #: (when it was processed, Unix time; latency ms) of every event sampled.
        self.timed: list[tuple[float, float]] = []
        self.stop = asyncio.Event()
        self.began = time.time()

    def p99(self, since: float | None, until: float | None) -> float | None:
        """The p99 of the events processed between two Unix times (None: too few)."""
        if since is None:
            return None
        chosen = [ms for t, ms in self.timed if t >= since and (until is None or t <= until)]
        if len(chosen) < 100:
            return None
        return float(summarize(chosen)["p99"])

    async def run(self) -> None:
        began = time.monotonic()
        conns = {d: await asyncpg.connect(self.bench.servers.pg.dsn(d))
                 for d in self.dep.topology.databases()}  # fmt: skip
        target = conns[self.dep.topology.contexts["vibespro"].database]
        last = await target.fetchval("SELECT now()")
        try:
            while True:
                stopping = self.stop.is_set()
                sizes: dict[str, dict[str, int]] = {}
                for database, conn in conns.items():
                    sizes[database] = {r["name"]: int(r["bytes"])
                                       for r in await conn.fetch(_SIZES, list(DRAWN))}  # fmt: skip
                now = await target.fetchval("SELECT now()")
                rows = await target.fetch(_LATENCIES, SEA_DURABLE, last, now)
                self.latencies += [float(r["ms"]) for r in rows]
                self.timed += [(float(r["at"]), float(r["ms"])) for r in rows]
                last = now
                rss = {n: v for n, v in self.bench.servers.book.rss().items()
                       if n in self.dep.role_names}  # fmt: skip
                self.samples.append({
                    "t": round(time.monotonic() - began, 1),
                    "bytes": {d: s["*"] for d, s in sizes.items()},
                    "tables": sizes, "rss": rss, "processed": len(rows),
                })  # fmt: skip
                if stopping:
                    return
                await sleep_unless(self.stop, self.every)
        finally:
            for conn in conns.values():
                await conn.close()

    def measure(self, acked: Acked) -> Any:
        """run_step's measure: the latencies sampled so far, the events acknowledged."""

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            del since  # the rows are purged as the run goes: sampled, not read back
            return {"processed": list(self.latencies)}, await acked.count()

        return measure


def draw(samples: list[dict[str, Any]], path: Path, keep: float) -> Path | None:
    """Each drawn table's size (and each database's) over the run, in MB."""
    if len(samples) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    minutes = [s["t"] / 60 for s in samples]
    for database in samples[0]["tables"]:
        for table in (*DRAWN, "*"):
            values = [s["tables"][database].get(table, 0) / 1e6 for s in samples]
            if max(values) <= 0:
                continue
            label = f"{database} (all)" if table == "*" else f"{database}.{table}"
            ax.plot(minutes, values, label=label, linestyle="--" if table == "*" else "-")
    ax.axvline(minutes[len(minutes) // 2], color="grey", linewidth=0.8)
    ax.set_xlabel("minutes into the run")
    ax.set_ylabel("MB")
    ax.set_title(f"Table sizes with everything kept {keep:g}s (second half right of the line)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
