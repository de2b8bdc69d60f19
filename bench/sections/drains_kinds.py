"""The drain kinds: what tells the end-to-end drains apart (their row, their section, their
tag) and the topology change each one runs under (per-message, batch calls, ordered)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import ratios
from bench.common import AGGREGATES, say
from bench.ratios import BATCH_TARGET
from bench.report import Target
from bench.sections.base import SEA_DURABLE, Bench


def _batch_topology(size: int) -> Callable[[dict[str, Any]], None]:
    """The change that makes the sea→vibespro durable call its handler ``size`` at a time."""

    def patch(doc: dict[str, Any]) -> None:
        doc["durables"][SEA_DURABLE]["handler"]["batch"] = size

    return patch


def _ordered_topology(partitions: int) -> Callable[[dict[str, Any]], None]:
    """The change that makes the sea→vibespro lane ordered: SEA_EVENTS with ``partitions``
    partitions (its subjects ``sea.event.>`` capture the token) and the durable
    ``ordering: key`` (key: the aggregate; a dead letter holds its key)."""

    def patch(doc: dict[str, Any]) -> None:
        doc["contexts"]["sea"]["stream"]["partitions"] = partitions
        durable = doc["durables"][SEA_DURABLE]
        durable["ordering"] = "key"
        durable["on_dead_letter"] = "hold"
        durable["handler"]["batch"] = 1  # compared with the per-message unordered drains

    return patch


@dataclass
class _DrainKind:
    """What tells the drains apart: their row, their section, their topology."""

    label: str
    key: str
    section: str
    tag: str
    target: Target | None = None
    patch: Callable[[dict[str, Any]], None] | None = None


def drain_kind(
    bench: Bench, mode: str, replicas: int, ordered: bool, batched: int = 0
) -> _DrainKind:
    rows = bench.options.rows
    many = "s" if replicas > 1 else ""
    if batched:
        say(f"end-to-end drain of {rows:,} events, {replicas} consumer replica{many}, batch "
            f"handler calls of up to {batched}, tracing {mode}")  # fmt: skip
        return _DrainKind(
            f"end-to-end backlog drain, {rows:,} events, {replicas} consumer{many}, batch "
            f"calls of {batched} (÷ raw POST /handle)",
            "ferry.e2e_drain_batch", "e2e_drain_batch", f"batch{replicas}", BATCH_TARGET,
            patch=_batch_topology(batched),
        )  # fmt: skip
    if not ordered:
        say(f"end-to-end drain of {rows:,} events, {replicas} consumer replica{many}, "
            f"tracing {mode}")  # fmt: skip
        # Issue 29: one consumer making one call per event, over the raw POST /handle.
        target = ratios.DRAIN_TARGET if replicas == 1 else None
        calls = ", per-message calls (÷ raw POST /handle)" if replicas == 1 else ""
        return _DrainKind(
            f"end-to-end backlog drain, {rows:,} events, {replicas} consumer{many}{calls}",
            f"ferry.e2e_drain_{replicas}", f"e2e_drain_{replicas}", f"drain{replicas}", target,
            patch=_batch_topology(1),  # per-message calls, whatever the topology ships
        )  # fmt: skip
    partitions = bench.options.ordered_partitions
    say(f"end-to-end ORDERED drain of {rows:,} events over {AGGREGATES:,} keys, "
        f"{partitions} partition(s), {replicas} consumer replica{many}, "
        f"tracing {mode}")  # fmt: skip
    return _DrainKind(
        f"end-to-end ordered drain, {rows:,} events, {AGGREGATES:,} keys, "
        f"{partitions} partition{'s' if partitions > 1 else ''}, {replicas} consumer{many}",
        "ferry.e2e_drain_ordered", "e2e_drain_ordered", f"ordered{replicas}",
        patch=_ordered_topology(partitions),
    )  # fmt: skip
