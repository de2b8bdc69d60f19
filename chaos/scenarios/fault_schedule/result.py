"""The result of the ordinary chaos run (:mod:`chaos.scenarios.fault_schedule.run`): the
fault timeline, the summary table (with the recovery per fault kind), and the files
:mod:`chaos.engine.results` writes to the run directory (``report.json``, ``summary.txt``,
``timeline.txt``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from chaos.engine.accounting import Accounts
from chaos.engine.faults import FaultRecord, Timeline
from chaos.engine.recovery_table import KindRecovery, recovery_doc, render_recovery
from chaos.engine.results import as_json
from chaos.engine.schedule import FAULT_KINDS, Schedule


@dataclass
class RunResult:
    """What happened."""

    seed: int
    schedule: Schedule
    accounts: Accounts
    timeline: Timeline
    duration: float
    fault_seconds: float
    drain_seconds: float | None
    drained: bool
    restarts: dict[str, int]
    unexpected_exits: list[str]
    producer: dict[str, Any]
    run_dir: Path
    summary: str = ""
    #: Per fault kind: rounds, p50 and max recovery (:mod:`chaos.engine.recovery_table`).
    recovery: dict[str, KindRecovery] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Drained in time and every invariant holds."""
        return self.drained and self.accounts.ok

    @property
    def violations(self) -> list[str]:
        """Every broken invariant (a failed drain included)."""
        extra = [] if self.drained else ["the drain did not finish in time"]
        return extra + self.accounts.violations

    def render(self) -> str:
        """The fault timeline and the summary, as the command prints them."""
        return f"Fault timeline\n{render_timeline(self.timeline)}\n\n{self.summary}"

    def files(self) -> dict[str, str]:
        """``report.json``, ``summary.txt``, ``timeline.txt``."""
        return {
            "report.json": as_json(_report_doc(self)),
            "summary.txt": self.summary + "\n",
            "timeline.txt": render_timeline(self.timeline) + "\n",
        }


def _row(label: str, *values: object, width: int = 24) -> str:
    return f"  {label:<38}" + "".join(f"{v!s:>{width}}" for v in values)


def render_timeline(timeline: Timeline) -> str:
    """Every fault and notable event, in order."""
    lines = [(r.started, r.line(timeline.origin)) for r in timeline.records]
    lines += [(at, f"t+{at - timeline.origin:7.2f}s  NOTE {text}") for at, text in timeline.events]
    return "\n".join(line for _, line in sorted(lines)) or "(no faults)"


def render_summary(result: RunResult) -> str:
    """The summary table of a run."""
    a = result.accounts
    verdict = "PASS" if result.ok else "FAIL"
    drain = f"{result.drain_seconds:.1f}s" if result.drain_seconds is not None else "NOT DRAINED"
    lines = [
        f"Chaos run '{result.schedule.name}', seed {result.seed}: {verdict}",
        f"  duration {result.duration:.1f}s (faults {result.fault_seconds:.1f}s, drain {drain})",
        "",
        "Events",
        _row("committed", a.committed, width=10),
        *(_row(f"  {klass}", n, width=10) for klass, n in sorted(a.by_class.items())),
        _row("commit outcome unknown → committed", a.uncertain_committed, width=10),
        _row("commit outcome unknown → not committed", a.uncertain_absent, width=10),
        _row("producer transactions", result.producer["transactions"], width=10),
        _row("producer reconnects", result.producer["reconnects"], width=10),
        "",
        "Faults injected",
    ]
    by_kind: Counter[str] = result.timeline.by_kind()
    for kind in FAULT_KINDS:
        if by_kind.get(kind):
            lines.append(_row(kind, by_kind[kind], width=10))
    failed = [r for r in result.timeline.records if not r.ok]
    window = [r for r in result.timeline.records if r.kind.endswith("in_window")]
    lines.append(_row("total", sum(by_kind.values()), width=10))
    if window:
        hit = sum(1 for r in window if r.detail.startswith("in window"))
        lines.append(_row("crash-window kills inside the window", f"{hit}/{len(window)}", width=10))
    if failed:
        lines.append(_row("faults that could not be injected", len(failed), width=10))
    lines += ["", *render_recovery(result.recovery, indent="")]
    lines += ["", _row("Per durable", *a.durables).replace("  Per", "Per", 1)]
    d = list(a.durables.values())
    reasons = sorted({r for c in d for r in c.dead_letters})
    lines += [
        _row("expected (committed)", *(c.expected for c in d)),
        _row("processed", *(c.processed for c in d)),
        *(_row(f"dead letters {r}", *(c.dead_letters.get(r, 0) for c in d)) for r in reasons),
        _row("expected dead letters (poison+exhausting)", *(c.expected_dead for c in d)),
        _row("LOST", *(len(c.lost) for c in d)),
        _row("outcome differs from class", *(len(c.wrong_outcome) for c in d)),
        _row("effects applied twice", *(len(c.double_effects) for c in d)),
        _row("handler calls", *(c.calls for c in d)),
        _row("redundant calls (already applied)", *(sum(c.redundant.values()) for c in d)),
        _row("  of which answered 409", *(c.redundant.get("409", 0) for c in d)),
        _row("  of which 5xx / unrecorded", *(_undecided(c.redundant) for c in d)),
        _row("redundant calls outside crash windows", *(len(c.unexplained) for c in d)),
        _row("duplicate deliveries absorbed by inbox", *(c.inbox_duplicates for c in d)),
        _row("ids twice in dead-letter stream", *(len(c.dlq_duplicates) for c in d)),
        "",
        _row("Per stream", *a.contexts).replace("  Per", "Per", 1),
        _row("committed", *(c.committed for c in a.contexts.values())),
        _row("in the stream", *(c.in_stream for c in a.contexts.values())),
        _row("ids twice in the stream", *(len(c.stream_duplicates) for c in a.contexts.values())),
        "",
        "Roles",
        *(_row(f"{name} restarts", n, width=10) for name, n in sorted(result.restarts.items())),
    ]
    if result.unexpected_exits:
        lines += ["", "Roles that exited by themselves:"] + [
            f"  {e}" for e in result.unexpected_exits
        ]
    lines += ["", "Invariants"]
    if result.ok:
        lines.append(
            "  all hold: 0 lost, dead letters exact, each id once per stream, no double effect"
        )
    for violation in result.violations:
        lines.append(f"  VIOLATED: {violation}")
    if not result.ok:
        lines.append(f"  re-run the same plan with --seed {result.seed}")
    return "\n".join(lines)


def _undecided(redundant: Counter[str]) -> int:
    return sum(n for status, n in redundant.items() if status == "None" or status.startswith("5"))


def _report_doc(result: RunResult) -> dict[str, Any]:
    return {
        "seed": result.seed,
        "schedule": result.schedule.name,
        "ok": result.ok,
        "duration": result.duration,
        "fault_seconds": result.fault_seconds,
        "drain_seconds": result.drain_seconds,
        "violations": result.violations,
        "faults_by_kind": dict(result.timeline.by_kind()),
        "recovery": recovery_doc(result.recovery),
        "faults": [_fault_doc(r, result.timeline.origin) for r in result.timeline.records],
        "notes": [[at - result.timeline.origin, text] for at, text in result.timeline.events],
        "accounts": _accounts_doc(result.accounts),
        "restarts": result.restarts,
        "unexpected_exits": result.unexpected_exits,
        "producer": result.producer,
    }


def _plain(value: Any) -> Any:
    """JSON-ready copy (``asdict`` would rebuild a Counter from pairs, counting them)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def _fault_doc(record: FaultRecord, origin: float) -> dict[str, Any]:
    doc: dict[str, Any] = _plain(record)
    doc["started"] = round(record.started - origin, 3)
    doc["ended"] = round(record.ended - origin, 3)
    doc["restored"] = round(record.restored - origin, 3) if record.restored else None
    return doc


def _accounts_doc(accounts: Accounts) -> dict[str, Any]:
    doc: dict[str, Any] = _plain(accounts)
    return doc
