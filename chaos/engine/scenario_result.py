"""A scenario's results (:mod:`chaos.engine.scenario`): the per-scenario table, as text and
as the files :mod:`chaos.engine.results` writes (``scenario.json``, ``scenario.txt``,
``fates.json``), with the recovery per fault kind (:mod:`chaos.engine.recovery_table`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.engine.recovery_table import KindRecovery, recovery_doc, render_recovery
from chaos.engine.results import as_json, render_head, render_tail, table_of
from chaos.engine.settled import Settled


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
    #: Per fault kind on the timeline: rounds, p50 and max recovery
    #: (:mod:`chaos.engine.recovery_table`).
    recovery: dict[str, KindRecovery] = field(default_factory=dict)

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
        return table_of(
            self.name,
            self,
            {
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
                "recovery": recovery_doc(self.recovery),
            },
        )

    def render(self) -> str:
        """The results table as text."""
        lines = render_head(
            self.name,
            self,
            ("exits", "restarts", "recovery"),
            counted=True,
        )
        lines += render_recovery(self.recovery)
        lines += render_tail(self.violations, self.notes, more_in="scenario.json")
        return "\n".join(lines)

    def files(self) -> dict[str, str]:
        """``scenario.json`` (the table), ``scenario.txt``, ``fates.json`` (each event's fate)."""
        return {
            "scenario.json": as_json(self.table()),
            "scenario.txt": self.render() + "\n",
            "fates.json": as_json(dict(self.settled.fate), indent=1),
        }
