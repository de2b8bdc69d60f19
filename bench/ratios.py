"""Issue 29's targets: each figure judged against a baseline measured in the same run.

The sections make the measured rows and :func:`bench.finish.finish` gives them their
baselines; :func:`finish` then adds what needs both sides of a run (the CPU per message
of a moderate load over a drain's) and makes sure every figure of the issue's table is
in the table, with its verdict per tracing mode: a figure whose section, or whose
baseline's section, was skipped (or failed) is a row that says so, not a missing row.
Pure functions over :class:`~bench.report.Results`: no servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.report import Results, Row, Target

#: End-to-end drain, 1 consumer, batch handler calls ÷ the raw per-message POST /handle.
BATCH_TARGET = Target(">=", 1.5, "≥ 1.5 x raw POST /handle", ratio=True)
#: The same drain with one call per event ÷ the raw per-message POST /handle.
DRAIN_TARGET = Target(">=", 0.8, "≥ 0.8 x raw POST /handle", ratio=True)
#: The offered load whose p99 is judged against the bare-bones pipeline's at that load.
LATENCY_RATE = 600
LATENCY_TARGET = Target("<=", 1.2, "p99 ≤ 1.2 x bare-bones", ratio=True)
#: Highest sustained rate ÷ the bare-bones pipeline's (same search, same criterion).
SUSTAINED_TARGET = Target(">=", 1.3, "≥ 1.3 x bare-bones", ratio=True)
#: CPU µs per message at :data:`LATENCY_RATE` ÷ the same in the 1-consumer drain.
CPU_TARGET = Target("<=", 1.5, "≤ 1.5 x")
#: Each mediation lane's p99: the seed's own target.
MEDIATION_TARGET = Target("<", 500.0, "p99 < 500 ms")
#: The one-consumer drain with tracing on (the run's ratio) ÷ the same drain off.
TRACING_TARGET = Target(">=", 0.9, "≥ 0.9 x")
#: outbox-publisher drain ÷ raw pipelined publish, and ÷ faststream-outbox's drain.
PUBLISHER_TARGET = Target(">=", 0.75, "≥ 0.75 x raw", ratio=True)
PEER_TARGET = Target(">=", 1.5, "≥ 1.5 x")
#: Issue 47: a drain with TLS on (NATS and the handler hop) ÷ the same drain with TLS off.
TLS_TARGET = Target(">=", 0.9, "≥ 0.9 x TLS off", ratio=True)

CPU_KEY = "ferry.cpu_moderate_vs_drain"
PROTO_SUSTAINED_KEY = "raw.proto_sustained"
#: Processes the CPU ratio counts (by name prefix): Ferry's roles and the two servers.
#: Left out on both sides: the producer (the application, not Ferry) and the OTLP sink.
CPU_COUNTED = ("publisher", "consumer", "handler", "nats-server", "postgres")


def latency_book(rate: int) -> str:
    """The CPU book's label of the latency step at ``rate``."""
    return f"latency {rate:,} msg/s"


def proto_book(rate: int) -> str:
    """The CPU book's label of the bare-bones pipeline's latency step at ``rate``."""
    return f"bare-bones pipeline {rate:,} msg/s"


@dataclass(frozen=True)
class Figure:
    """One line of issue 29's table, as the row that judges it."""

    key: str
    #: The row's label when no section made it (a section skipped or failed).
    label: str
    unit: str
    target: Target
    #: Sections that measure the figure, and those that measure its baseline.
    measured_by: tuple[str, ...]
    baseline_by: tuple[str, ...] = ()
    #: Why the row is missing although its sections ran.
    absent: str = "not measured: its section failed (see errors)"


FIGURES = (
    Figure("ferry.e2e_drain_batch", "end-to-end backlog drain, 1 consumer, batch calls "
           "(÷ raw POST /handle)", "msg/s", BATCH_TARGET, ("drain",), ("baselines",)),
    Figure("ferry.e2e_drain_1", "end-to-end backlog drain, 1 consumer, per-message calls "
           "(÷ raw POST /handle)", "msg/s", DRAIN_TARGET, ("drain",), ("baselines",)),
    Figure(f"ferry.latency_{LATENCY_RATE}", f"end-to-end latency p50/p95/p99 at "
           f"{LATENCY_RATE:,} msg/s offered", "ms", LATENCY_TARGET, ("latency",),
           ("prototype",), absent=f"not measured: --rates has no {LATENCY_RATE} msg/s step, "
           "or the section failed (see errors)"),
    Figure("ferry.sustained", "highest sustained rate, producer on the box (÷ bare-bones)",
           "msg/s", SUSTAINED_TARGET, ("sustained",), ("prototype",)),
    Figure(CPU_KEY, "", "x", CPU_TARGET, ("latency", "drain")),
    Figure("ferry.mediation_e_to_f", "mediation E→F latency p50/p95/p99", "ms",
           MEDIATION_TARGET, ("mediation",)),
    Figure("ferry.mediation_f_to_g", "mediation F→G latency p50/p95/p99", "ms",
           MEDIATION_TARGET, ("mediation",)),
    Figure("ferry.tracing_cost", "drain with tracing on ÷ off, 1 consumer", "x",
           TRACING_TARGET, ("drain",)),
    Figure("ferry.publisher_drain", "outbox-publisher drain (÷ raw JetStream publish)", "msg/s",
           PUBLISHER_TARGET, ("publisher",), ("baselines",)),
    Figure("ferry.vs_peer", "outbox-publisher drain / faststream-outbox drain", "x",
           PEER_TARGET, ("publisher", "peer")),
)  # fmt: skip


def cpu_label(rate: int = LATENCY_RATE) -> str:
    return f"CPU µs per message at {rate:,} msg/s ÷ 1-consumer drain, same calls (roles, NATS, PG)"


def finish(results: Results, sections: Iterable[str], modes: list[str]) -> None:
    """Issue 29's rows, once every section ran and the baselines are set."""
    chosen = set(sections)
    finish_sustained_ratio(results)
    finish_floor_ratio(results, modes)
    finish_cpu_ratio(results, modes, skipped=_skipped(chosen, ("latency", "drain")))
    rows = {r.key: r for r in results.rows}
    for figure in FIGURES:
        row = rows.get(figure.key)
        if row is None:
            label = cpu_label() if figure.key == CPU_KEY else figure.label
            row = results.row(figure.key, label, figure.unit, target=figure.target)
            reason = _skipped(chosen, figure.measured_by) or figure.absent
            for mode in modes:
                row.not_measured(mode, reason)
            continue
        if figure.target.ratio and not row.baseline:
            why = _skipped(chosen, figure.baseline_by) or "not measured: its row says why"
            note = f"baseline {why}"
            if note not in row.notes:
                row.notes.append(note)
        elif not row.values:
            why = _skipped(chosen, figure.measured_by) or figure.absent
            for mode in modes:
                row.not_measured(mode, why)


def _skipped(chosen: set[str], needs: Iterable[str]) -> str:
    skipped = [name for name in needs if name not in chosen]
    if not skipped:
        return ""
    many = "s" if len(skipped) > 1 else ""
    return f"not measured: section{many} {', '.join(skipped)} skipped"


#: The bare-bones pipeline's per-message drain (``bench.sections.bare_bones``).
PROTO_DRAIN_KEY = "raw.proto_drain"


def finish_floor_ratio(results: Results, modes: list[str]) -> None:
    """Ferry's per-message drain over the bare-bones pipeline's (same backlog, same box):
    what Ferry's features cost a drain that calls the handler once per event. No target:
    it sets the per-message target's figure beside the floor the pipeline itself allows."""
    rows = {r.key: r for r in results.rows}
    ferry, proto = rows.get("ferry.e2e_drain_1"), rows.get(PROTO_DRAIN_KEY)
    floor = proto.values.get("raw") if proto is not None else None
    if ferry is None or not floor:
        return
    row = results.row("ferry.e2e_drain_vs_proto", "end-to-end per-message drain, Ferry ÷ "
                      "the bare-bones pipeline's (same backlog)", "x")  # fmt: skip
    for mode in modes:
        value = ferry.values.get(mode)
        if value is not None:
            row.set(mode, value / floor, f"{value / floor:.2f}")
    note = (
        f"the bare-bones pipeline drained {floor:,.0f} msg/s; its handler is lighter "
        "than the example handler (no signature, envelope or schema checks)"
    )
    if note not in row.notes:
        row.notes.append(note)


def finish_sustained_ratio(results: Results) -> None:
    """Ferry's highest sustained rate judged against the bare-bones pipeline's."""
    rows = {r.key: r for r in results.rows}
    ferry, proto = rows.get("ferry.sustained"), rows.get(PROTO_SUSTAINED_KEY)
    if ferry is None or proto is None:
        return
    ferry.baseline = proto.values.get("raw")
    ferry.baseline_label = ("highest sustained rate of the bare-bones pipeline (same search, "
                            "same criterion)")  # fmt: skip
    if ferry.baseline and any("--sustain-max" in note for note in proto.notes):
        ferry.notes.append("the bare-bones search stopped at --sustain-max: its rate is a "
                           "lower bound, the ratio an upper bound")  # fmt: skip


def cpu_per_message(entry: Mapping[str, Any]) -> float:
    """CPU µs per message of the processes :data:`CPU_COUNTED` names, in one CPU book entry."""
    spent = sum(s for name, s in entry["cpu_s"].items() if name.startswith(CPU_COUNTED))
    return float(spent) / max(int(entry["messages"]), 1) * 1e6


def finish_cpu_ratio(
    results: Results, modes: list[str], rate: int = LATENCY_RATE, skipped: str = ""
) -> Row:
    """CPU per message of the ``rate`` latency step over the 1-consumer drain's, per mode.

    ``skipped``: the reason to give a mode with a side missing (a skipped section).
    """
    row = results.row(CPU_KEY, cpu_label(rate), "x", target=CPU_TARGET)
    # Like with like: the latency lane's handler calls as the topology ships them (batch
    # calls of N, or one per event), over the 1-consumer drain making the same calls.
    batched = int(results.meta.get("latency_handler_batch", 1)) > 1
    drain_key = "ferry.e2e_drain_batch" if batched else "ferry.e2e_drain_1"
    drain = next((r for r in results.rows if r.key == drain_key), None)
    books = {(e["label"], e["mode"]): e for e in results.cpu}
    for mode in modes:
        step = books.get((latency_book(rate), mode))
        base = books.get((drain.label, mode)) if drain is not None else None
        if step is None or base is None:
            drained_by = "1-consumer batch-call drain" if batched else "1-consumer drain"
            sides = {f"{rate:,} msg/s latency step": step, drained_by: base}
            missing = " and no ".join(what for what, entry in sides.items() if entry is None)
            row.not_measured(mode, skipped or f"not measured: this run has no {missing}")
            continue
        moderate, drained = cpu_per_message(step), cpu_per_message(base)
        if not drained:
            row.not_measured(mode, "not measured: the drain booked no CPU")
            continue
        ratio = moderate / drained
        row.set(mode, ratio, f"{ratio:.2f} = {moderate:,.0f} ÷ {drained:,.0f} µs")
        per_message = next((r for r in results.rows if r.key == "ferry.e2e_drain_1"), None)
        other = books.get((per_message.label, mode)) if batched and per_message else None
        if other is not None and cpu_per_message(other):
            also = moderate / cpu_per_message(other)
            row.notes.append(f"tracing {mode}: {also:.2f} x the per-message drain's "
                             f"{cpu_per_message(other):,.0f} µs (the measure issue 29 "
                             "started from)")  # fmt: skip
        proto = books.get((proto_book(rate), "raw"))
        if proto is not None and cpu_per_message(proto):
            row.notes.append(f"tracing {mode}: {moderate / cpu_per_message(proto):.2f} x the "
                             f"bare-bones pipeline's {cpu_per_message(proto):,.0f} µs at "
                             f"{rate:,} msg/s, counted alike")  # fmt: skip
        results.sections.setdefault("cpu_ratio", {})[mode] = {
            "rate": rate, "us_per_msg_at_rate": round(moderate, 1),
            "us_per_msg_drain": round(drained, 1), "counted": list(CPU_COUNTED),
        }  # fmt: skip
    calls = (
        "batch calls (the latency lane ships handler.batch > 1), so the drain is the "
        "batch-call drain"
        if batched
        else "one call per event on both sides"
    )
    if f"handler calls: {calls}" not in row.notes:
        row.notes.append(f"handler calls: {calls}")
    note = ("counted on both sides: Ferry's roles (publisher, consumer, example handler), "
            "nats-server and PostgreSQL (every backend but the producer's own sessions, "
            "whose transactions a drain's backlog also makes before its book opens: "
            "producer-pg); not counted: the producer (the application, its sessions "
            "included) and the OTLP sink")  # fmt: skip
    if note not in row.notes:
        row.notes.append(note)
    return row
