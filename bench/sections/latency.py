"""Latency at fixed offered loads, and the highest sustained rate."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bench import ratios, search
from bench.common import say, summarize
from bench.report import Target
from bench.sections.base import (
    SEA_DURABLE,
    SUSTAIN_ACHIEVED,
    SUSTAIN_P99_MS,
    Bench,
    ferry_row,
    note_spans,
    sink_spans,
)
from bench.sections.steps import Step, committed, run_step, sea_lane, sea_latencies
from bench.world import (
    Deployment,
)

LATENCY_TARGETS = {ratios.LATENCY_RATE: ratios.LATENCY_TARGET}


async def latency(bench: Bench, mode: str) -> None:
    """Fixed offered loads, then (if selected) the highest sustained rate, on one deployment."""
    opts = bench.options
    async with bench.deployment("sea-vibespro", mode, f"latency-{mode}") as dep:
        handler_url = await dep.start_handler("vibespro")
        await dep.start_consumer(SEA_DURABLE, handler_url)
        await dep.start_publisher("sea")
        source_dsn, target_dsn = dep.dsn("sea"), dep.dsn("vibespro")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await sea_latencies(source_dsn, target_dsn, since)

        say(f"latency, tracing {mode}: warm-up {opts.warmup_seconds:.0f}s at 200 msg/s")
        await run_step(bench, dep, [sea_lane(dep, 200)], opts.warmup_seconds, measure,
                       committed)  # fmt: skip
        if "latency" in opts.sections:
            for rate in opts.rates:
                await _latency_step(bench, dep, mode, rate, measure)
        if "sustained" in opts.sections:
            await sustained(bench, dep, mode, measure)


async def _latency_step(bench: Bench, dep: Deployment, mode: str, rate: int,
                        measure: Any) -> None:  # fmt: skip
    seconds = bench.options.seconds
    say(f"latency at {rate:,} msg/s offered for {seconds:.0f}s, tracing {mode}")
    spans0 = await sink_spans(bench)
    step = await run_step(bench, dep, [sea_lane(dep, rate)], seconds, measure, committed)
    spans = await sink_spans(bench) - spans0
    record_latency(bench, mode, f"{rate:,} msg/s", f"ferry.latency_{rate}",
                    f"end-to-end latency p50/p95/p99 at {rate:,} msg/s offered",
                    step, "processed", LATENCY_TARGETS.get(rate), spans,
                    what=ratios.latency_book(rate))  # fmt: skip
    _note_handler_calls(bench, f"ferry.latency_{rate}", dep)


def _note_handler_calls(bench: Bench, key: str, dep: Deployment) -> None:
    """Say how the measured lane calls its handler (as the shipped topology declares)."""
    batch = dep.topology.durables[SEA_DURABLE].handler.batch
    bench.results.meta["latency_handler_batch"] = batch  # the CPU ratio's like-with-like
    calls = f"batch calls of up to {batch}" if batch > 1 else "per-message calls"
    note = f"{SEA_DURABLE} as topologies/sea-vibespro.yaml ships it: {calls}"
    row = bench.results.row(key, "", "")
    if note not in row.notes:
        row.notes.append(note)


#: A producer commit lag (p99, ms) this large is named in the latency row's notes.
LAG_NOTED_MS = 100.0


def producer_lag_note(lanes: list[dict[str, Any]], from_insert: list[float]) -> str:
    """What the row should say when the producer's own commits fell behind schedule.

    Latency counts from each event's due instant (no coordinated omission), so a stall in
    the producer's transactions (its PostgreSQL commits, the VM) is in the headline p99.
    The producer reports how far each commit lagged its due instant; when the worst lane's
    p99 lag is :data:`LAG_NOTED_MS` or more, the note gives it beside the latency from the
    outbox row's insert (which leaves the producer's own queueing out). Empty otherwise.
    """
    lags = [lane.get("commit_lag_ms") or {} for lane in lanes]
    worst = max(lags, key=lambda lag: float(lag.get("p99", 0.0)), default={})
    if float(worst.get("p99", 0.0)) < LAG_NOTED_MS:
        return ""
    note = (f"the producer's commits lagged their due instants by p99 {worst['p99']:,.0f} ms "
            f"(max {float(worst.get('max', 0.0)):,.0f} ms)")  # fmt: skip
    if from_insert:
        p99 = summarize(from_insert)["p99"]
        note += f"; from the outbox insert to processed, p99 {p99:,.0f} ms"
    return note


def record_latency(
    bench: Bench, mode: str, series: str, key: str, label: str, step: Step, column: str,
    target: Target | None, spans: int, lane: str = "", book: bool = True,
    what: str = "",
) -> None:  # fmt: skip
    values = step.latencies[column]
    stats = summarize(values)
    row = ferry_row(bench, key, label, "ms", target=target)
    shown = f"{stats.get('p50', 0):.1f}/{stats.get('p95', 0):.1f}/{stats.get('p99', 0):.1f}"
    row.set(mode, stats.get("p99", float("nan")), shown if values else "n/m")
    producer = step.producer["lanes"]
    if lane:
        producer = [p for p in producer if p["name"] == lane] or producer
    achieved = sum(p["achieved"] for p in producer)
    offered = sum(p["offered"] for p in producer)
    said = "" if mode == "raw" else f"tracing {mode}: "
    if offered and achieved < SUSTAIN_ACHIEVED * offered:
        row.notes.append(f"{said}the producer achieved only {achieved:,.0f} msg/s")
    lag_note = producer_lag_note(producer, step.latencies.get("from_insert", []))
    if lag_note:
        row.notes.append(f"{said}{lag_note}")
    if step.unprocessed:
        row.notes.append(f"{said}{step.unprocessed:,} events not processed in time")
    if step.started_busy:
        row.notes.append(f"{said}began before the previous step's backlog was done")
    bench.results.samples.setdefault(mode, {})[series] = values
    doc = {"offered": offered, "achieved": achieved, "latency_ms": stats,
           "other_latencies_ms": {k: summarize(v) for k, v in step.latencies.items()},
           "unprocessed": step.unprocessed, "producer": step.producer,
           "spans_exported": spans, "cpu_s": step.cpu, "batches": step.batches}  # fmt: skip
    bench.results.sections.setdefault("latency", {}).setdefault(mode, {})[series] = doc
    if book:
        events = max(committed(step.producer), 1)
        if not what:
            what = ("mediation, per E event (2 lanes)" if lane == "module_e"
                    else f"latency {series}")  # fmt: skip
        bench.results.book_cpu(what, mode, events, step.seconds, step.cpu)
        bench.results.book_statements(what, mode, events, step.statements)
    note_spans(bench, mode, spans)
    say(f"  {series}, tracing {mode}: p50 {stats.get('p50', 0):.1f}  p95 "
        f"{stats.get('p95', 0):.1f}  p99 {stats.get('p99', 0):.1f} ms "
        f"(producer {achieved:,.0f}/s, unprocessed {step.unprocessed})")  # fmt: skip


async def sustained(
    bench: Bench, dep: Deployment, mode: str, measure: Any, *, bare_bones: bool = False
) -> None:
    """Raise the offered load step by step; the highest step that holds is the figure.

    The search is :func:`bench.search.search_sustained`: upwards from ``--sustain-start``
    by ``--sustain-step`` until a step fails; if the very first fails, downwards by halves
    (to 100 msg/s) until one holds; then bisection until the rates that held and failed are
    an eighth apart. A step failed on latency alone is run once more before it counts.

    ``bare_bones``: the same search and criterion on the bare-bones pipeline
    (:func:`prototype`, mode ``raw``), the baseline of Ferry's figure.
    """
    what = "bare-bones sustained" if bare_bones else "sustained"
    tried: list[dict[str, Any]] = []
    opts = bench.options

    async def step(rate: int) -> str:
        return await _sustain_step(bench, dep, mode, rate, measure, tried, what)

    found = await search.search_sustained(
        step, start=opts.sustain_start, increment=opts.sustain_step, ceiling=opts.sustain_max
    )
    passed, failed = found.passed, found.failed
    if bare_bones:
        row = bench.results.row(ratios.PROTO_SUSTAINED_KEY, "bare-bones pipeline, highest "
                                "sustained rate, producer on the box", "msg/s")  # fmt: skip
    else:
        row = ferry_row(bench, "ferry.sustained", "highest sustained rate, producer on the box "
                        "(÷ bare-bones)", "msg/s", target=ratios.SUSTAINED_TARGET)  # fmt: skip
        _note_handler_calls(bench, "ferry.sustained", dep)
    said = "" if bare_bones else f"tracing {mode}: "
    row.set(mode, float(passed) if passed is not None else None)
    if passed is None:
        row.notes.append(f"{said}not even 100 msg/s held")
    if failed is not None:
        row.notes.append(f"{said}{failed[0]:,} msg/s failed: {failed[1]}")
    elif passed is not None:
        row.notes.append(f"{said}the search stopped at its ceiling --sustain-max")
    bench.results.sections.setdefault("sustained", {})[mode] = {
        "highest": passed, "first_failure": failed, "steps": tried,
        "criteria": {"achieved_fraction": SUSTAIN_ACHIEVED, "p99_ms": SUSTAIN_P99_MS,
                     "grace_s": 10},
    }  # fmt: skip


async def _sustain_step(bench: Bench, dep: Deployment, mode: str, rate: int, measure: Any,
                        tried: list[dict[str, Any]], what: str) -> str:  # fmt: skip
    """Run one step; return why it failed ('' when it held)."""
    seconds = bench.options.seconds
    tracing = "" if mode == "raw" else f", tracing {mode}"
    say(f"{what}? {rate:,} msg/s for {seconds:.0f}s{tracing}")
    step = await run_step(bench, dep, [sea_lane(dep, rate)], seconds, measure, committed,
                          grace=10.0)  # fmt: skip
    lane = step.producer["lanes"][0]
    p99 = step.p99("processed")
    reasons = []
    if step.started_busy:
        reasons.append("the previous step's backlog was not done after --drain-budget")
    if lane["errors"]:
        reasons.append(f"{lane['errors']} producer errors")
    if lane["achieved"] < SUSTAIN_ACHIEVED * rate:
        reasons.append(f"producer achieved {lane['achieved']:,.0f} msg/s")
    if step.unprocessed:
        reasons.append(f"{step.unprocessed:,} events unprocessed 10 s after the producer stopped")
    if not p99 <= SUSTAIN_P99_MS:
        reasons.append(f"p99 {p99:,.0f} ms" if p99 == p99 else "no event processed")
    verdict = "; ".join(reasons)
    tried.append({"rate": rate, "achieved": lane["achieved"], "p99_ms": p99,
                  "unprocessed": step.unprocessed, "held": not verdict, "why_not": verdict,
                  "cpu_s": step.cpu})  # fmt: skip
    bench.results.book_cpu(f"{what} step {rate:,} msg/s", mode,
                           max(lane["committed"], 1), step.seconds, step.cpu)  # fmt: skip
    bench.results.book_statements(f"{what} step {rate:,} msg/s", mode,
                                  max(lane["committed"], 1), step.statements)  # fmt: skip
    say(f"  {rate:,} msg/s: {'held' if not verdict else 'failed: ' + verdict} (p99 {p99:,.1f} ms)")
    return verdict
