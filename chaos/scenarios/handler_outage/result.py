"""The handler outage's result (:mod:`chaos.scenarios.handler_outage.run`): the figures
(:mod:`chaos.scenarios.handler_outage.figures`), the invariants that always gate, the
issue's targets that gate the breaker's arm, and the files (``report.json``,
``summary.txt``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.engine.results import CountedResult, as_json, render_rows, render_tail
from chaos.scenarios.handler_outage.figures import Figures
from chaos.scenarios.handler_outage.plan import (
    DRAIN_TARGET,
    DRAIN_TARGET_UP_TO,
    DURABLE,
    RESUME_TARGET,
    SCENARIO,
)

#: What the ordinary count says of dead letters of ``normal`` events: with the breaker
#: off they are what the comparison arm measures, not a broken invariant.
DEAD_LETTER_CHECKS = (
    f"{DURABLE}: outcome differs from the event's class:",
    f"{DURABLE}: dead letters not in the poison/exhausted set:",
)


@dataclass(kw_only=True)
class OutageResult(CountedResult):
    """What the outage did to the lane, with the breaker on or off."""

    breaker: bool
    events_planned: int
    seconds: float
    outage_at: float
    outage: float
    #: Whether the handler's link really went down and came back (and what was said).
    outage_ok: bool
    outage_detail: str
    figures: Figures | None

    @property
    def violations(self) -> list[str]:
        """The invariants, whichever the arm: the drain, 0 lost, 0 applied twice, the
        ordinary count (but, breaker off, the dead letters it measures), the outage done,
        no role exit nobody asked for."""
        out = [
            v
            for v in self.counted_violations()
            if self.breaker or not v.startswith(DEAD_LETTER_CHECKS)
        ]
        if not self.outage_ok:
            out.append(f"the outage could not be injected: {self.outage_detail}")
        f = self.figures
        if f is None:
            out.append("the figures could not be read")
        else:
            if f.lost:
                out.append(f"{DURABLE}: lost {f.lost} (figures)")
            if f.applied_twice:
                out.append(f"{DURABLE}: applied twice {f.applied_twice} (figures)")
        out += [f"unexpected exit: {e}" for e in self.unexpected_exits]
        return out

    @property
    def missed(self) -> list[str]:
        """The issue's targets the breaker's arm missed (none for the comparison arm)."""
        f = self.figures
        if not self.breaker or f is None:
            return []
        out = []
        if f.resume is None or f.resume > RESUME_TARGET:
            out.append(
                f"first apply after the return {_s(f.resume)} (target <= {RESUME_TARGET:g}s)"
            )
        if self.outage <= DRAIN_TARGET_UP_TO and (
            f.drain is None or f.drain > DRAIN_TARGET or f.backlog_unapplied
        ):
            out.append(
                f"backlog drained after the return {_s(f.drain)} (target <= {DRAIN_TARGET:g}s)"
            )
        if f.dead_letters:
            out.append(f"dead letters {f.dead_letters} (target 0)")
        if f.past_second_without_probes:
            out.append(
                f"events past their 2nd delivery, probes excluded: {f.past_second_without_probes}"
                " (target 0)"
            )
        return out

    @property
    def ok(self) -> bool:
        """Every invariant holds and, breaker on, every target is met."""
        return not self.violations and not self.missed

    @property
    def verdict(self) -> str:
        """PASS, FAIL (an invariant), MISSED TARGET, or, breaker off, COMPARISON ARM."""
        if self.violations:
            return "FAIL"
        if not self.breaker:
            return "COMPARISON ARM (breaker off: figures only, the invariants hold)"
        return "MISSED TARGET" if self.missed else "PASS"

    def table(self) -> dict[str, Any]:
        """The results (``report.json``)."""
        return {
            "scenario": SCENARIO,
            "size": self.size,
            "seed": self.seed,
            "verdict": self.verdict,
            "breaker": "on" if self.breaker else "off",
            "events planned": self.events_planned,
            "seconds": self.seconds,
            "outage at": self.outage_at,
            "outage": self.outage,
            "rate (events/s)": round(self.events_planned / self.seconds, 1),
            "outage injected": self.outage_ok,
            "outage detail": self.outage_detail,
            "figures": None if self.figures is None else self.figures.doc(),
            "targets": {
                "first apply after return (s)": RESUME_TARGET,
                "backlog drained after return (s)": (
                    DRAIN_TARGET if self.outage <= DRAIN_TARGET_UP_TO else None
                ),
                "dead letters": 0,
                "events past their 2nd delivery, probes excluded": 0,
            },
            "targets missed": self.missed,
            **self.accounts.totals(),
            "role restarts": self.role_restarts,
            "drain seconds": self.drain_seconds,
            "duration seconds": round(self.duration, 1),
            "violations": self.violations,
            "notes": self.notes,
        }

    def render(self) -> str:
        """The results as text."""
        arm = "on" if self.breaker else "off"
        lines = [
            f"Scenario {SCENARIO} ({self.size}), seed {self.seed}, breaker {arm}: {self.verdict}",
            f"  {self.events_planned} events over {self.seconds:g}s"
            f" ({self.events_planned / self.seconds:.1f}/s), the handler down from"
            f" t+{self.outage_at:g}s for {self.outage:g}s; drain {_s(self.drain_seconds)},"
            f" {self.duration:.0f}s in all",
        ]
        if self.figures is not None:
            lines += ["", "Figures"]
            lines += render_rows(self.figures.doc(), (), width=50)
        lines += ["", f"Targets ({'the breaker' if self.breaker else 'not gated: comparison arm'})"]
        lines += [f"  missed: {m}" for m in self.missed] or ["  all met" if self.breaker else "  -"]
        lines += ["", "Invariants"]
        lines += [] if self.violations else ["  all hold: 0 lost, 0 applied twice, drained"]
        lines += render_tail(self.violations, self.notes)
        return "\n".join(lines)

    def files(self) -> dict[str, str]:
        """``report.json`` and ``summary.txt``."""
        return {"report.json": as_json(self.table()), "summary.txt": self.render() + "\n"}


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"
