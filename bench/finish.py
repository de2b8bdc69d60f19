"""What the bench works out once every section ran: baselines, ratios and verdicts."""

from __future__ import annotations

from bench import ratios
from bench import sections as s
from bench.ratios import TRACING_TARGET
from bench.report import Results, Row
from bench.world import traces_ratio


def finish(bench: s.Bench) -> None:
    """Tracing availability, baselines and ratios, once everything is measured."""
    results = bench.results
    raw = {r.key: r.values.get("raw") for r in results.rows if r.key.startswith("raw.")}
    labels = {r.key: r.label for r in results.rows}
    # The raw stages each figure's events go through (a backlog drain has no producer).
    drain_path = ("raw.js_publish", "raw.js_consume", "raw.http")
    paths = {
        "ferry.publisher_drain": ("raw.js_publish",),
        # Issue 29 judges the per-message drain against the raw POST /handle, like the
        # batch-call drain.
        "ferry.e2e_drain_1": ("raw.http",),
        "ferry.e2e_drain_2": drain_path,
        "ferry.e2e_drain_ordered": drain_path,
        # The batch-call drain is judged against the per-message HTTP round trip itself
        # (issue 29: what batching gains over one POST per event).
        "ferry.e2e_drain_batch": ("raw.http",),
    }
    for row in results.rows:
        stages = {k: raw[k] for k in paths.get(row.key, ()) if raw.get(k)}
        if not stages:
            continue
        slowest = min(stages, key=lambda k: stages[k] or 0.0)
        row.baseline = stages[slowest]
        row.baseline_label = (
            labels[slowest]
            if len(stages) == 1
            else f"slowest raw stage on its path: {labels[slowest]}"
        )
    for row in results.rows:
        if row.key.startswith("ferry.latency_"):
            finish_latency_baseline(results, row, raw)
    s.finish_peer_ratio(results)
    s.finish_ordered_ratio(results)
    finish_tracing_ratio(results)
    ratios.finish(results, bench.options.sections, bench.options.modes)
    if "on" in bench.options.modes and not bench.tracing_available.get("on"):
        reason = ("not measured: tracing not available (the roles exported no spans to the "
                  "OTLP sink with FERRY_TRACES_EXPORTER=otlp)")  # fmt: skip
        for row in results.rows:
            if "on" in row.values:
                row.not_measured("on", reason)


def finish_latency_baseline(results: Results, row: Row, raw: dict[str, float | None]) -> None:
    """The bare-bones p99 a Ferry latency row is judged against: the lowest the bare-bones
    pipeline showed at that offered load anywhere in the run.

    The VM's speed drifts by a third over a run, and the bare-bones pipeline's fixed-rate
    step and its sustained search each ran once, minutes apart: one run's step saturated
    at 600 msg/s (p99 4,153 ms) while a search step at 600 msg/s of the same section held
    at 67 ms. Judging Ferry's one step against the bare-bones pipeline's best showing is
    the stricter yardstick; the note gives every figure.
    """
    rate = row.key.removeprefix("ferry.latency_")
    shown: dict[str, float] = {}
    step = raw.get("raw.proto_" + rate)
    if step:
        shown["its latency step"] = float(step)
    searched = results.sections.get("sustained", {}).get("raw", {}).get("steps", [])
    for index, tried in enumerate(searched, start=1):
        p99 = tried.get("p99_ms")
        if str(tried.get("rate")) == rate and p99 is not None and p99 == p99 and p99 > 0:
            shown[f"its sustained search's step {index}"] = float(p99)
    if not shown:
        return
    where, best = min(shown.items(), key=lambda item: item[1])
    row.baseline = best
    row.baseline_label = "lowest p99 of the bare-bones pipeline at the same offered load"
    if len(shown) > 1:
        listed = ", ".join(f"{p99:,.0f} ms ({what})" for what, p99 in shown.items())
        note = f"bare-bones p99 at this load in this run: {listed}; judged against {where}"
        if note not in row.notes:
            row.notes.append(note)


def finish_tracing_ratio(results: Results) -> None:
    """The one-consumer drain with tracing on over the same drain off, once both ran.

    A run of one mode gets the row too, saying it needs ``--tracing both``; a run without
    the drain is left to :func:`bench.ratios.finish`, which says which section was skipped.
    """
    drain = next((r for r in results.rows if r.key == "ferry.e2e_drain_1"), None)
    if drain is None:
        return
    percent = f"{float(traces_ratio()) * 100:g}"
    row = results.row(
        "ferry.tracing_cost", f"drain with tracing on ({percent} %) ÷ off, 1 consumer", "x",
        target=TRACING_TARGET,
    )  # fmt: skip
    if "on" not in drain.values or "off" not in drain.values:
        for mode in drain.values:
            row.not_measured(mode, f"not measured: needs --tracing both (this run measured "
                                   f"tracing {mode} only)")  # fmt: skip
        return
    on, off = drain.values.get("on"), drain.values.get("off")
    if on is None or not off:
        row.not_measured("on", "not measured: a drain of one mode is missing or partial")
        return
    row.set("on", on / off, f"{on / off:.2f} = {on:,.0f} ÷ {off:,.0f} msg/s")
    # Two drains a minute apart see the VM at different speeds; CPU per message moves
    # less with it, so the note gives the same comparison in CPU.
    books = {(e["label"], e["mode"]): e for e in results.cpu}
    cpu_on, cpu_off = (books.get((drain.label, mode)) for mode in ("on", "off"))
    if cpu_on is not None and cpu_off is not None:
        spent_on, spent_off = ratios.cpu_per_message(cpu_on), ratios.cpu_per_message(cpu_off)
        if spent_on:
            row.notes.append(
                f"the same in CPU per message (roles, NATS, PostgreSQL): off ÷ on "
                f"{spent_off / spent_on:.2f} = {spent_off:,.0f} ÷ {spent_on:,.0f} µs"
            )
