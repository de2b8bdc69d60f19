"""The cluster scenarios' results: each fault's row, the run's result with its invariants
(:class:`ClusterResult`) and the results table as text (:func:`render_cluster_table`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.accounting import Accounts


@dataclass
class FaultRow:
    """One fault's line of the results table."""

    kind: str
    at: float
    target: str
    detail: str
    ok: bool
    recovery: float | None


@dataclass
class ClusterResult:
    """What a cluster scenario did and what became of its events."""

    name: str
    size: str
    seed: int
    accounts: Accounts
    faults: list[FaultRow]
    probe_sent: int
    probe_acked: int
    probe_unacked: dict[str, int]
    acked_missing: list[str]
    outbox_acked_missing: list[str]
    restarts: dict[str, int]
    unexpected_exits: list[str]
    drained: bool
    drain_seconds: float | None
    duration: float
    run_dir: Path
    notes: list[str] = field(default_factory=list)
    #: Median seconds from commit to processed before the first fault (recovery's yardstick).
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
            out.append(f"acknowledged by JetStream, missing: {len(self.acked_missing)}")
        if self.outbox_acked_missing:
            out.append(f"marked published, not in the stream: {len(self.outbox_acked_missing)}")
        if self.role_restarts:
            out.append(f"roles needed a restart: {self.role_restarts}")
        out += [f"fault not injected: {f.kind} {f.detail}" for f in self.faults if not f.ok]
        return out

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.violations

    def table(self) -> dict[str, Any]:
        """The results table (also written as ``cluster.json``)."""
        a = self.accounts
        durables = a.durables.values()
        return {
            "scenario": self.name,
            "size": self.size,
            "seed": self.seed,
            "verdict": "PASS" if self.ok else "FAIL",
            "events committed": a.committed,
            "faults injected": dict(Counter(f.kind for f in self.faults if f.ok)),
            "lost": sum(len(d.lost) for d in durables),
            "effects applied twice": sum(len(d.double_effects) for d in durables),
            "dead letters (expected)": sum(d.expected_dead for d in durables),
            "dead letters (found)": sum(sum(d.dead_letters.values()) for d in durables),
            "ids twice in a stream": sum(len(c.stream_duplicates) for c in a.contexts.values()),
            "probe publishes acknowledged": self.probe_acked,
            "probe publishes without PubAck": sum(self.probe_unacked.values()),
            "acknowledged but missing (probe)": len(self.acked_missing),
            "acknowledged but missing (outbox)": len(self.outbox_acked_missing),
            "role restarts": self.role_restarts,
            "latency before the faults (median s)": (
                None if self.baseline_latency is None else round(self.baseline_latency, 2)
            ),
            "faults": [
                {
                    "kind": f.kind,
                    "at": f.at,
                    "target": f.target,
                    "recovery seconds": f.recovery,
                    "detail": f.detail,
                }
                for f in self.faults
            ],
            "drain seconds": self.drain_seconds,
            "duration seconds": round(self.duration, 1),
            "violations": self.violations,
            "notes": self.notes,
        }


def render_cluster_table(result: ClusterResult) -> str:
    """The results table as text."""
    lines = [f"Scenario {result.name} ({result.size}), seed {result.seed}"]
    for key, value in result.table().items():
        if key in ("scenario", "size", "seed", "violations", "notes", "faults"):
            continue
        if isinstance(value, dict):
            lines.append(f"  {key}")
            lines += [f"      {k:<40}{v!s:>8}" for k, v in sorted(value.items())]
        else:
            lines.append(f"  {key:<44} {value}")
    lines.append("  per fault (recovery: fault to the first event committed after it processed)")
    for f in result.faults:
        recovery = "-" if f.recovery is None else f"{f.recovery:.1f}s"
        lines.append(f"    t+{f.at:6.1f}s {f.kind:<20} {f.target:<10} recovery {recovery:>7}")
        lines.append(f"        {f.detail}")
    lines += [f"  VIOLATED: {v}" for v in result.violations]
    lines += [f"  note: {n[:200]}" for n in result.notes[:12]]
    return "\n".join(lines)
