"""The recovery table every run prints and writes: per fault kind, how many were injected
and the p50 and max of their recoveries (:mod:`chaos.engine.recovery`), held against the
target of issue 44 — a fault costs seconds, not minutes.

One place renders it, so each scenario's summary and report say it the same way; a
result keeps the table as :class:`KindRecovery` values by kind (``result.recovery[kind]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaos.engine.faults import FaultRecord

#: Seconds a single fault may cost (for an outage the run imposes: after it is over).
TARGET_SECONDS = 15.0


@dataclass(frozen=True)
class KindRecovery:
    """One fault kind's line: faults injected, and the p50 and max of the recoveries
    measured (None: no fault of the kind had an affected event come through after it)."""

    rounds: int
    measured: int
    p50: float | None
    max: float | None

    @property
    def within_target(self) -> bool | None:
        """Every fault of the kind recovered within :data:`TARGET_SECONDS` (None: unknown)."""
        return None if self.max is None else self.max <= TARGET_SECONDS

    def doc(self) -> dict[str, Any]:
        """The report's entry (seconds, one decimal)."""
        return {
            "rounds": self.rounds,
            "measured": self.measured,
            "p50": self.p50,
            "max": self.max,
            "within target": self.within_target,
        }


def nearest_rank(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of ``values``: always a value that was measured."""
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


def kind_recovery(figures: Sequence[float | None]) -> KindRecovery:
    """One kind's line from the recoveries of its injected faults."""
    measured = [f for f in figures if f is not None]
    if not measured:
        return KindRecovery(len(figures), 0, None, None)
    p50, worst = nearest_rank(measured, 0.5), max(measured)
    return KindRecovery(len(figures), len(measured), round(p50, 1), round(worst, 1))


def recovery_table(
    records: Sequence[FaultRecord], figures: Sequence[float | None]
) -> dict[str, KindRecovery]:
    """Per fault kind (in the order first injected), from each record's recovery (the
    same order as ``records``); faults that could not be injected are left out."""
    by_kind: dict[str, list[float | None]] = {}
    for record, figure in zip(records, figures, strict=True):
        if record.ok:
            by_kind.setdefault(record.kind, []).append(figure)
    return {kind: kind_recovery(found) for kind, found in by_kind.items()}


def recovery_doc(table: Mapping[str, KindRecovery]) -> dict[str, dict[str, Any]]:
    """The table as a report's ``recovery`` entry: kind -> rounds, p50, max, ..."""
    return {kind: line.doc() for kind, line in table.items()}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _mark(line: KindRecovery) -> str:
    if line.within_target is None:
        return "no event came through after it"
    return "ok" if line.within_target else f"OVER {TARGET_SECONDS:.0f} s"


def render_recovery(table: Mapping[str, KindRecovery], indent: str = "  ") -> list[str]:
    """The table as text lines: a heading, then one line per kind."""
    head = (
        f"{indent}Recovery per fault kind (the longest wait of an event it held back;"
        f" target {TARGET_SECONDS:.0f} s)"
    )
    if not table:
        return [head, f"{indent}    (no fault on the timeline)"]
    lines = [head, f"{indent}    {'kind':<36}{'rounds':>7}{'p50':>9}{'max':>9}"]
    for kind, line in table.items():
        lines.append(
            f"{indent}    {kind:<36}{line.rounds:>7}{_seconds(line.p50):>9}"
            f"{_seconds(line.max):>9}  {_mark(line)}"
        )
    return lines
