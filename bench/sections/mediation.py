"""The mediation lanes E→F and F→G together at the seed's peak."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from bench import ratios
from bench.common import say
from bench.sections.base import Bench, ferry_row, sink_spans
from bench.sections.latency import record_latency
from bench.sections.steps import committed, run_step


async def mediation(bench: Bench, mode: str) -> None:
    """Lanes E→F and F→G of INFRA-005 together, producer feeding E at the E→F peak."""
    opts = bench.options
    rate = opts.mediation_rate
    say(f"mediation lanes, {rate:,} msg/s into E→F (each forwarded F→G), tracing {mode}")
    async with bench.deployment("mediation", mode, f"mediation-{mode}") as dep:
        f_url = await dep.start_handler("module_f")
        g_url = await dep.start_handler("module_g")
        await dep.start_consumer("cg_f_ingest", f_url)
        await dep.start_consumer("cg_g_archive", g_url)
        await dep.start_publisher("module_e")
        await dep.start_publisher("module_f")
        f_dsn, g_dsn = dep.dsn("module_f"), dep.dsn("module_g")

        async def measure(since: datetime) -> tuple[dict[str, list[float]], int]:
            return await mediation_latencies(f_dsn, g_dsn, since)

        lane = {"name": "module_e", "dsn": dep.dsn("module_e"),
                "event_type": "opportunity_scored", "rate": rate}  # fmt: skip
        await run_step(bench, dep, [{**lane, "rate": 200}], opts.warmup_seconds, measure,
                       committed)  # fmt: skip
        spans0 = await sink_spans(bench)
        step = await run_step(bench, dep, [lane], opts.seconds, measure, committed)
        spans = await sink_spans(bench) - spans0
    series = {"e_to_f": "E→F", "f_to_g": "F→G", "e_to_g": "E→F→G"}
    # Module F forwards every E event: F→G is offered what E→F is (the seed's peaks are
    # 600 E→F and 400 F→G). Each lane is judged against the seed's own p99 < 500 ms.
    offered = f"{rate:,} E→F + {rate:,} F→G msg/s (every E event forwarded)"
    for column, name in series.items():
        record_latency(
            bench, mode, f"mediation {name}", f"ferry.mediation_{column}",
            f"mediation {name} latency p50/p95/p99, {offered}", step, column,
            ratios.MEDIATION_TARGET if column != "e_to_g" else None, spans, lane="module_e",
            book=column == "e_to_f",
        )  # fmt: skip
        row = ferry_row(bench, f"ferry.mediation_{column}", "", "ms")
        note = (f"offered {rate:,} msg/s into E→F and, as module F forwards every E event, "
                f"{rate:,} into F→G; the seed's peak is 600 E→F + 400 F→G")  # fmt: skip
        if column != "e_to_g" and note not in row.notes:
            row.notes.append(note)


async def mediation_latencies(
    f_dsn: str, g_dsn: str, since: datetime
) -> tuple[dict[str, list[float]], int]:
    """E→F (F's inbox), F→G (G's inbox) and E→G through F's forward (causation id)."""
    f = await asyncpg.connect(f_dsn)
    g = await asyncpg.connect(g_dsn)
    try:
        f_rows = await f.fetch(
            "SELECT message_id, occurred_at, processed_at FROM inbox_messages"
            " WHERE durable = 'cg_f_ingest' AND status = 'processed' AND occurred_at >= $1",
            since,
        )
        forwards = await f.fetch(
            "SELECT id, causation_id FROM outbox_events WHERE occurred_at >= $1", since
        )
        g_rows = await g.fetch(
            "SELECT message_id, occurred_at, processed_at FROM inbox_messages"
            " WHERE durable = 'cg_g_archive' AND status = 'processed' AND occurred_at >= $1",
            since,
        )
    finally:
        await f.close()
        await g.close()
    e_occurred = {r["message_id"]: r["occurred_at"] for r in f_rows}
    cause = {r["id"]: r["causation_id"] for r in forwards}
    ms = 1000.0
    e_to_f = [(r["processed_at"] - r["occurred_at"]).total_seconds() * ms for r in f_rows]
    f_to_g = [(r["processed_at"] - r["occurred_at"]).total_seconds() * ms for r in g_rows]
    e_to_g = []
    for r in g_rows:
        origin = e_occurred.get(cause.get(r["message_id"]))
        if origin is not None:
            e_to_g.append((r["processed_at"] - origin).total_seconds() * ms)
    # Done when every E event has come out of G as well.
    return {"e_to_f": e_to_f, "f_to_g": f_to_g, "e_to_g": e_to_g}, len(e_to_g)
