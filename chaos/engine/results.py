"""The result writer: every run's result says which files it has and how it reads as text
(:class:`Result`); :func:`write_result` writes the files to the run directory, and the
helpers here render the results tables the same way for every scenario."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from chaos.engine.accounting import Accounts
from chaos.engine.recovery_table import KindRecovery


class Result(Protocol):
    """What a run hands back: a verdict, a text to print, and the files to write."""

    @property
    def run_dir(self) -> Path:
        """The run directory (the files go there)."""

    @property
    def ok(self) -> bool:
        """Every invariant holds."""

    def render(self) -> str:
        """The results as the command prints them."""

    def files(self) -> dict[str, str]:
        """File name -> content, in the order the command names them."""


@dataclass(kw_only=True)
class CountedResult:
    """The result of a run counted by the ordinary invariants (:mod:`chaos.engine.accounting`)
    besides its own: what the cluster scenarios and the failover drill share."""

    size: str
    seed: int
    accounts: Accounts
    restarts: dict[str, int]
    unexpected_exits: list[str]
    drained: bool
    drain_seconds: float | None
    duration: float
    run_dir: Path
    notes: list[str] = field(default_factory=list)
    #: Median seconds from commit to processed before the first fault (recovery's yardstick).
    baseline_latency: float | None = None
    #: Per fault kind: rounds, p50 and max recovery (:mod:`chaos.engine.recovery_table`).
    recovery: dict[str, KindRecovery] = field(default_factory=dict)

    @property
    def role_restarts(self) -> int:
        """Restarts of any role (none is planned: every one was needed)."""
        return sum(self.restarts.values())

    def counted_violations(self) -> list[str]:
        """The drain and the ordinary invariants (a run's own violations follow them)."""
        return ([] if self.drained else ["the drain did not finish in time"]) + list(
            self.accounts.violations
        )

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""
        return self.counted_violations()

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.violations


class Tabled(Protocol):
    """A run whose results table begins and ends as every scenario's does."""

    @property
    def size(self) -> str:
        """The size the run was played at (``ci``, ``soak``)."""

    @property
    def seed(self) -> int:
        """The run's seed."""

    @property
    def ok(self) -> bool:
        """Every invariant holds."""

    @property
    def drain_seconds(self) -> float | None:
        """How long the drain took (None: it did not finish)."""

    @property
    def duration(self) -> float:
        """Seconds the whole run took."""

    @property
    def violations(self) -> list[str]:
        """Every broken invariant."""

    @property
    def notes(self) -> list[str]:
        """What the run noted on the way."""

    def table(self) -> dict[str, Any]:
        """The results table (its head and tail from :func:`table_of`)."""


def table_of(name: str, run: Tabled, rows: dict[str, Any]) -> dict[str, Any]:
    """A run's results table: which scenario, its size, seed and verdict; then ``rows``; last
    the drain, the duration, what broke and the notes."""
    return {
        "scenario": name,
        "size": run.size,
        "seed": run.seed,
        "verdict": "PASS" if run.ok else "FAIL",
        **rows,
        "drain seconds": run.drain_seconds,
        "duration seconds": round(run.duration, 1),
        "violations": run.violations,
        "notes": run.notes,
    }


def render_head(
    name: str, run: Tabled, skip: Iterable[str], *, width: int = 44, counted: bool = False
) -> list[str]:
    """A results table's first lines as text: the title, then the rows of ``run.table()``
    but ``skip`` and those the title and :func:`render_tail` say."""
    titled = ("scenario", "size", "seed", "violations", "notes")
    rows = render_rows(run.table(), (*titled, *skip), width=width, counted=counted)
    return [f"Scenario {name} ({run.size}), seed {run.seed}", *rows]


def as_json(doc: Any, indent: int = 2) -> str:
    """A report file's JSON text."""
    return json.dumps(doc, indent=indent, default=str) + "\n"


def write_file(run_dir: Path, name: str, text: str) -> None:
    """One report file in the run directory."""
    (run_dir / name).write_text(text)


def write_result(result: Result) -> None:
    """Every file of ``result`` in its run directory."""
    for name, text in result.files().items():
        write_file(result.run_dir, name, text)


def report_line(result: Result) -> str:
    """Where the command says the report went."""
    return f"report: {result.run_dir}/{', '.join(result.files())}, logs/"


def render_rows(
    table: Mapping[str, Any], skip: Iterable[str], *, width: int = 44, counted: bool = False
) -> list[str]:
    """A results table's rows: ``key value`` lines, a dict's items indented below its key
    (``counted``: the key line says `` 0`` when the dict is empty)."""
    lines = []
    skipped = set(skip)
    for key, value in table.items():
        if key in skipped:
            continue
        if not isinstance(value, dict):
            lines.append(f"  {key:<{width}} {value}")
            continue
        lines.append(f"  {key:<{width}}" + (" " if value else " 0") if counted else f"  {key}")
        for k, v in sorted(value.items()):
            if isinstance(v, dict):  # one durable's counts, on one line
                lines.append(f"      {k}: " + ", ".join(f"{a} {b}" for a, b in v.items()))
            else:
                lines.append(f"      {k:<40}{v!s:>8}")
    return lines


def render_tail(violations: list[str], notes: list[str], more_in: str | None = None) -> list[str]:
    """The last rows of a results table: each broken invariant, the first notes."""
    lines = [f"  VIOLATED: {v}" for v in violations]
    lines += [f"  note: {n[:200]}" for n in notes[:12]]
    if more_in is not None and len(notes) > 12:
        lines.append(f"  ({len(notes) - 12} more notes in {more_in})")
    return lines
