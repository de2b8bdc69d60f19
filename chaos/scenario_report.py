"""A scenario's results: the per-scenario table (text and ``scenario.json``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.scenario_accounting import Settled


@dataclass
class ScenarioResult:
    """What a scenario did and what became of its events."""

    name: str
    size: str
    seed: int
    settled: Settled
    faults: Counter[str]
    unexpected_exits: list[str]
    restarts: dict[str, int]
    drained: bool
    drain_seconds: float | None
    duration: float
    run_dir: Path
    notes: list[str] = field(default_factory=list)
    #: ``role: exception`` of each unexpected exit, counted.
    exit_causes: Counter[str] = field(default_factory=Counter)
    #: Dead letters the hostile handler's answers do not account for.
    without_cause: list[str] = field(default_factory=list)
    #: A scenario's own rows of the table (the ordering scenario's counts).
    extra: dict[str, Any] = field(default_factory=dict)
    #: A scenario's own broken invariants.
    extra_violations: list[str] = field(default_factory=list)

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        extra = [] if self.drained else ["the drain did not finish in time"]
        exits = [f"unexpected role exits: {len(self.unexpected_exits)}"]
        if self.without_cause:
            shown = ", ".join(self.without_cause[:4])
            extra.append(f"dead-lettered without cause: {len(self.without_cause)} ({shown})")
        extra += self.extra_violations
        return extra + self.settled.violations() + (exits if self.unexpected_exits else [])

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.violations

    def table(self) -> dict[str, Any]:
        """The per-scenario results table (also written as JSON)."""
        s = self.settled
        return {
            "scenario": self.name,
            "size": self.size,
            "seed": self.seed,
            "verdict": "PASS" if self.ok else "FAIL",
            "events committed": s.committed,
            "refused at the source": dict(s.refused),
            "faults injected": dict(self.faults),
            "processed": s.processed,
            "dead-lettered by reason": dict(s.dead_lettered),
            "set aside by the publisher": dict(s.set_aside),
            "held behind a set-aside row": s.held_behind,
            "stuck in the outbox": len(s.stuck),
            "lost": len(s.lost),
            "effects applied twice": len(s.effects_twice),
            "applied, then dead-lettered": s.applied_then_dead_lettered,
            "duplicate deliveries absorbed by the inbox": s.duplicates_absorbed,
            "dead-lettered without cause": len(self.without_cause),
            **self.extra,
            "unexpected role exits": len(self.unexpected_exits),
            "unexpected exits by cause": dict(self.exit_causes),
            "exits": self.unexpected_exits,
            "restarts": self.restarts,
            "drain seconds": self.drain_seconds,
            "duration seconds": round(self.duration, 1),
            "violations": self.violations,
            "notes": self.notes,
        }


def render_table(result: ScenarioResult) -> str:
    """The results table as text."""
    lines = [f"Scenario {result.name} ({result.size}), seed {result.seed}"]
    for key, value in result.table().items():
        if key in ("scenario", "size", "seed", "exits", "violations", "notes", "restarts"):
            continue
        if isinstance(value, dict):
            lines.append(f"  {key:<44}" + (" " if value else " 0"))
            for k, v in sorted(value.items()):
                if isinstance(v, dict):  # one durable's counts, on one line
                    lines.append(f"      {k}: " + ", ".join(f"{a} {b}" for a, b in v.items()))
                else:
                    lines.append(f"      {k:<40}{v!s:>8}")
        else:
            lines.append(f"  {key:<44} {value}")
    lines += [f"  VIOLATED: {v}" for v in result.violations]
    lines += [f"  note: {n[:200]}" for n in result.notes[:12]]
    if len(result.notes) > 12:
        lines.append(f"  ({len(result.notes) - 12} more notes in scenario.json)")
    return "\n".join(lines)


def write_scenario_report(result: ScenarioResult) -> None:
    """``scenario.json`` (the table) and ``scenario.txt`` in the run directory."""
    out = result.run_dir
    (out / "scenario.json").write_text(json.dumps(result.table(), indent=2, default=str) + "\n")
    (out / "scenario.txt").write_text(render_table(result) + "\n")
    fates = {i: f for i, f in result.settled.fate.items()}
    (out / "fates.json").write_text(json.dumps(fates, indent=1) + "\n")
