"""The cluster scenarios' results: each fault's row, the run's result with its invariants
(:class:`ClusterResult`, whose ``render`` is the results table as text)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.engine.recovery_table import recovery_doc, render_recovery
from chaos.engine.results import CountedResult, as_json, render_head, render_tail, table_of


@dataclass
class FaultRow:
    """One fault's line of the results table."""

    kind: str
    at: float
    target: str
    detail: str
    ok: bool
    recovery: float | None


@dataclass(kw_only=True)
class ClusterResult(CountedResult):
    """What a cluster scenario did and what became of its events."""

    name: str
    faults: list[FaultRow]
    probe_sent: int
    probe_acked: int
    probe_unacked: dict[str, int]
    acked_missing: list[str]
    outbox_acked_missing: list[str]

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        out = self.counted_violations()
        if self.acked_missing:
            out.append(f"acknowledged by JetStream, missing: {len(self.acked_missing)}")
        if self.outbox_acked_missing:
            out.append(f"marked published, not in the stream: {len(self.outbox_acked_missing)}")
        if self.role_restarts:
            out.append(f"roles needed a restart: {self.role_restarts}")
        out += [f"fault not injected: {f.kind} {f.detail}" for f in self.faults if not f.ok]
        return out

    def table(self) -> dict[str, Any]:
        """The results table (also written as ``cluster.json``)."""
        a = self.accounts
        return table_of(
            self.name,
            self,
            {
                "events committed": a.committed,
                "faults injected": dict(Counter(f.kind for f in self.faults if f.ok)),
                **a.totals(),
                "probe publishes acknowledged": self.probe_acked,
                "probe publishes without PubAck": sum(self.probe_unacked.values()),
                "acknowledged but missing (probe)": len(self.acked_missing),
                "acknowledged but missing (outbox)": len(self.outbox_acked_missing),
                "role restarts": self.role_restarts,
                "latency before the faults (median s)": (
                    None if self.baseline_latency is None else round(self.baseline_latency, 2)
                ),
                "recovery": recovery_doc(self.recovery),
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
            },
        )

    def render(self) -> str:
        """The results table as text."""
        lines = render_head(self.name, self, ("faults", "recovery"))
        lines += render_recovery(self.recovery)
        lines.append("  per fault (recovery: the longest wait of an event it held back)")
        for f in self.faults:
            recovery = "-" if f.recovery is None else f"{f.recovery:.1f}s"
            lines.append(f"    t+{f.at:6.1f}s {f.kind:<20} {f.target:<10} recovery {recovery:>7}")
            lines.append(f"        {f.detail}")
        return "\n".join(lines + render_tail(self.violations, self.notes))

    def files(self) -> dict[str, str]:
        """``cluster.json`` (the table) and ``cluster.txt``."""
        return {"cluster.json": as_json(self.table()), "cluster.txt": self.render() + "\n"}
