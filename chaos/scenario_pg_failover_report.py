"""The failover drill's results (:mod:`chaos.scenario_pg_failover`): one row per failover,
the whole result with its invariants, and the results table (JSON and text)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.accounting import Accounts
from chaos.scenario_pg_failover_plan import SCENARIO


@dataclass
class FailoverRow:
    """One failover's line of the results table."""

    at: float
    killed: str
    promoted: str
    promote_seconds: float
    writes_back: float | None
    recovery: float | None
    acked_at_risk: int
    detail: str
    ok: bool


@dataclass
class FailoverResult:
    """What the drill did and what became of its events."""

    size: str
    seed: int
    accounts: Accounts
    failovers: list[FailoverRow]
    acked: int
    acked_missing: list[str]
    restarts: dict[str, int]
    unexpected_exits: list[str]
    drained: bool
    drain_seconds: float | None
    duration: float
    run_dir: Path
    producer_errors: dict[str, int] = field(default_factory=dict)
    #: Commits whose outcome the producer could not know (the connection died in COMMIT),
    #: and how many of them the new primary's outbox holds.
    unsure: int = 0
    unsure_committed: int = 0
    notes: list[str] = field(default_factory=list)
    baseline_latency: float | None = None

    @property
    def role_restarts(self) -> int:
        """Restarts of any role (none is planned: every one was needed)."""
        return sum(self.restarts.values())

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        out = [] if self.drained else ["the drain did not finish in time"]
        out += self.accounts.violations
        if self.acked_missing:
            out.append(
                f"commits acknowledged, missing on the new primary: {len(self.acked_missing)}"
            )
        if self.role_restarts:
            out.append(f"roles needed a restart: {self.role_restarts}")
        out += [f"failover failed: {f.detail}" for f in self.failovers if not f.ok]
        out += [
            f"the pipeline did not recover after the failover at t+{f.at:.0f}s"
            for f in self.failovers
            if f.ok and f.recovery is None
        ]
        return out

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.violations

    def table(self) -> dict[str, Any]:
        """The results table (also written as ``pg-failover.json``)."""
        a = self.accounts
        durables = a.durables.values()
        return {
            "scenario": SCENARIO,
            "size": self.size,
            "seed": self.seed,
            "verdict": "PASS" if self.ok else "FAIL",
            "events committed": a.committed,
            "commit outcome unknown (connection lost)": self.unsure,
            "  of which in the new primary's outbox": self.unsure_committed,
            "failovers": sum(1 for f in self.failovers if f.ok),
            "lost": sum(len(d.lost) for d in durables),
            "effects applied twice": sum(len(d.double_effects) for d in durables),
            "dead letters (expected)": sum(d.expected_dead for d in durables),
            "dead letters (found)": sum(sum(d.dead_letters.values()) for d in durables),
            "ids twice in a stream": sum(len(c.stream_duplicates) for c in a.contexts.values()),
            "commits acknowledged to the producers": self.acked,
            "acknowledged but missing on the new primary": len(self.acked_missing),
            "role restarts": self.role_restarts,
            "latency before the failover (median s)": (
                None if self.baseline_latency is None else round(self.baseline_latency, 2)
            ),
            "per failover": [
                {
                    "at": f.at,
                    "killed": f.killed,
                    "promoted": f.promoted,
                    "promote seconds": f.promote_seconds,
                    "writes back seconds": f.writes_back,
                    "recovery seconds": f.recovery,
                    "acknowledged in the 5 s before the kill": f.acked_at_risk,
                    "detail": f.detail,
                }
                for f in self.failovers
            ],
            "producer errors": self.producer_errors,
            "drain seconds": self.drain_seconds,
            "duration seconds": round(self.duration, 1),
            "violations": self.violations,
            "notes": self.notes,
        }


def render_failover_table(result: FailoverResult) -> str:
    """The results table as text."""
    lines = [f"Scenario {SCENARIO} ({result.size}), seed {result.seed}"]
    for key, value in result.table().items():
        if key in ("scenario", "size", "seed", "violations", "notes", "per failover"):
            continue
        if isinstance(value, dict):
            lines.append(f"  {key}")
            lines += [f"      {k:<40}{v!s:>8}" for k, v in sorted(value.items())]
        else:
            lines.append(f"  {key:<46} {value}")
    lines.append("  per failover (recovery: kill to the first event committed after it processed)")
    for f in result.failovers:
        back = "-" if f.writes_back is None else f"{f.writes_back:.1f}s"
        rec = "-" if f.recovery is None else f"{f.recovery:.1f}s"
        lines.append(
            f"    t+{f.at:6.1f}s {f.killed} killed, {f.promoted} promoted:"
            f" writes back {back}, recovery {rec}, {f.acked_at_risk} acked in the 5 s before"
        )
        lines.append(f"        {f.detail}")
    lines += [f"  VIOLATED: {v}" for v in result.violations]
    lines += [f"  note: {n[:200]}" for n in result.notes[:12]]
    return "\n".join(lines)
