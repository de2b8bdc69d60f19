"""The failover drill's results (:mod:`chaos.scenarios.pg_failover.run`): one row per failover,
the whole result with its invariants, and the results table (JSON and text)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.engine.recovery_table import recovery_doc, render_recovery
from chaos.engine.results import CountedResult, as_json, render_head, render_tail, table_of
from chaos.scenarios.pg_failover.plan import SCENARIO


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


@dataclass(kw_only=True)
class FailoverResult(CountedResult):
    """What the drill did and what became of its events."""

    failovers: list[FailoverRow]
    acked: int
    acked_missing: list[str]
    producer_errors: dict[str, int] = field(default_factory=dict)
    #: Commits whose outcome the producer could not know (the connection died in COMMIT),
    #: and how many of them the new primary's outbox holds.
    unsure: int = 0
    unsure_committed: int = 0

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        out = self.counted_violations()
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

    def table(self) -> dict[str, Any]:
        """The results table (also written as ``pg-failover.json``)."""
        a = self.accounts
        return table_of(
            SCENARIO,
            self,
            {
                "events committed": a.committed,
                "commit outcome unknown (connection lost)": self.unsure,
                "  of which in the new primary's outbox": self.unsure_committed,
                "failovers": sum(1 for f in self.failovers if f.ok),
                **a.totals(),
                "commits acknowledged to the producers": self.acked,
                "acknowledged but missing on the new primary": len(self.acked_missing),
                "role restarts": self.role_restarts,
                "latency before the failover (median s)": (
                    None if self.baseline_latency is None else round(self.baseline_latency, 2)
                ),
                "recovery": recovery_doc(self.recovery),
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
            },
        )

    def render(self) -> str:
        """The results table as text."""
        lines = render_head(SCENARIO, self, ("per failover", "recovery"), width=46)
        lines += render_recovery(self.recovery)
        lines.append("  per failover (recovery: the longest wait of an event it held back)")
        for f in self.failovers:
            back = "-" if f.writes_back is None else f"{f.writes_back:.1f}s"
            rec = "-" if f.recovery is None else f"{f.recovery:.1f}s"
            lines.append(
                f"    t+{f.at:6.1f}s {f.killed} killed, {f.promoted} promoted:"
                f" writes back {back}, recovery {rec}, {f.acked_at_risk} acked in the 5 s before"
            )
            lines.append(f"        {f.detail}")
        return "\n".join(lines + render_tail(self.violations, self.notes))

    def files(self) -> dict[str, str]:
        """``pg-failover.json`` (the table) and ``pg-failover.txt``."""
        return {
            "pg-failover.json": as_json(self.table()),
            "pg-failover.txt": self.render() + "\n",
        }
