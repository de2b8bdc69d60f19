"""What a run reports: the table, the CPU table, the JSON document and the plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Value columns: Ferry with tracing on (production settings), Ferry with tracing off,
#: and raw figures (baselines and the peer), in the order they are printed.
MODES = ("on", "off", "raw")
COLUMN_TITLES = {"on": "Ferry, tracing on", "off": "Ferry, tracing off", "raw": "raw / peer"}


@dataclass
class Target:
    """A target from the issue: ``value op limit`` (a ratio when ``ratio`` is set)."""

    op: str  # ">=", "<=" or "<"
    limit: float
    text: str
    ratio: bool = False

    def met(self, value: float) -> bool:
        if self.op == ">=":
            return value >= self.limit
        if self.op == "<":
            return value < self.limit
        return value <= self.limit


@dataclass
class Row:
    """One line of the table: a measure per tracing mode, its baseline, its target."""

    key: str
    label: str
    unit: str
    values: dict[str, float | None] = field(default_factory=dict)
    shown: dict[str, str] = field(default_factory=dict)
    baseline: float | None = None
    baseline_label: str = ""
    target: Target | None = None
    notes: list[str] = field(default_factory=list)

    def set(self, mode: str, value: float | None, shown: str | None = None) -> None:
        self.values[mode] = value
        self.shown[mode] = shown if shown is not None else _fmt(value)

    def not_measured(self, mode: str, reason: str) -> None:
        self.values[mode] = None
        self.shown[mode] = "n/m"
        if reason not in self.notes:
            self.notes.append(reason)

    def ratio(self, mode: str) -> float | None:
        value = self.values.get(mode)
        if value is None or not self.baseline:
            return None
        return value / self.baseline

    def judged(self, mode: str) -> str:
        """The verdict of one mode's figure: met, MISSED or n/m (not measured)."""
        if self.target is None:
            return ""
        value = self.values.get(mode)
        judged = self.ratio(mode) if self.target.ratio else value
        if judged is None or math.isnan(judged):
            return "n/m"
        return "met" if self.target.met(judged) else "MISSED"

    def verdicts(self) -> dict[str, str]:
        """The verdict of every mode the row has a column for."""
        if self.target is None:
            return {}
        return {mode: self.judged(mode) for mode in MODES if mode in self.values}

    def verdict(self) -> str:
        """Every mode's verdict: one word when they agree, else ``on MISSED, off met``."""
        if self.target is None:
            return ""
        verdicts = self.verdicts()
        if len(set(verdicts.values())) == 1:
            return next(iter(verdicts.values()))
        if not verdicts:
            return "n/m"
        return ", ".join(f"{mode} {word}" for mode, word in verdicts.items())

    def ratios_shown(self) -> str:
        """The ratio to the baseline of every mode, ``/``-separated in column order."""
        if not self.baseline:
            return ""
        shown = []
        for mode in MODES:
            if mode in self.values:
                ratio = self.ratio(mode)
                shown.append("n/m" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}")
        return "/".join(shown)


@dataclass
class Results:
    """Everything one run measured."""

    meta: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    cpu: list[dict[str, Any]] = field(default_factory=list)
    #: Per measurement (``--statements``): the statements PostgreSQL ran, per message.
    statements: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Not written to JSON in full: latency samples (ms) per plot series, per mode.
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def row(self, key: str, label: str, unit: str, **kwargs: Any) -> Row:
        """The row ``key``, created on first use."""
        for row in self.rows:
            if row.key == key:
                return row
        new = Row(key, label, unit, **kwargs)
        self.rows.append(new)
        return new

    def book_cpu(self, label: str, mode: str, messages: int, seconds: float,
                 cpu_s: dict[str, float], *, merge: bool = False) -> None:  # fmt: skip
        """CPU seconds per process spent on ``messages`` messages in ``seconds`` of wall time.

        ``merge``: a measurement run again (the one-consumer drain's pairs) adds to its
        first entry, the figure being all its messages over all their CPU."""
        for entry in self.cpu if merge else ():
            if entry["label"] == label and entry["mode"] == mode:
                entry["messages"] += messages
                entry["seconds"] = round(entry["seconds"] + seconds, 3)
                for name, spent in cpu_s.items():
                    entry["cpu_s"][name] = entry["cpu_s"].get(name, 0.0) + spent
                entry["runs"] = entry.get("runs", 1) + 1
                return
        self.cpu.append({"label": label, "mode": mode, "messages": messages,
                         "seconds": round(seconds, 3), "cpu_s": dict(cpu_s)})  # fmt: skip

    def book_statements(self, label: str, mode: str, messages: int,
                        delta: dict[str, tuple[float, float]]) -> None:  # fmt: skip
        """The statements run for ``messages`` messages: calls and ms, per message."""
        if not delta:
            return
        per = max(messages, 1)
        top = sorted(delta.items(), key=lambda item: -item[1][0])
        self.statements.append({
            "label": label, "mode": mode, "messages": messages,
            "calls_per_msg": round(sum(c for c, _ in delta.values()) / per, 2),
            "statements": [{"query": " ".join(q.split()), "calls_per_msg": round(c / per, 3),
                            "exec_us_per_msg": round(ms * 1000 / per, 1)}
                           for q, (c, ms) in top if c],
        })  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        rows = []
        for row in self.rows:
            doc = asdict(row)
            doc["ratio"] = {m: _round(row.ratio(m)) for m in MODES if m in row.values}
            doc["verdict"] = row.verdict()
            doc["verdicts"] = row.verdicts()
            rows.append(doc)
        return {"meta": self.meta, "table": rows, "sections": self.sections,
                "cpu_per_message": self.cpu_table(), "statements": self.statements,
                "errors": self.errors}  # fmt: skip

    def cpu_table(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.cpu:
            messages = max(entry["messages"], 1)
            per = {name: round(s / messages * 1e6, 1) for name, s in entry["cpu_s"].items()}
            total = sum(entry["cpu_s"].values())
            out.append({
                "label": entry["label"], "mode": entry["mode"], "messages": entry["messages"],
                "us_per_msg": per, "total_us_per_msg": round(total / messages * 1e6, 1),
                "cores_busy": round(total / entry["seconds"], 2) if entry["seconds"] else None,
            })  # fmt: skip
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/m"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def table(results: Results) -> str:
    """The main table as text."""
    modes = [m for m in MODES if any(m in r.values for r in results.rows)]
    width = max([len(r.label) for r in results.rows] + [20]) + 2
    head = f"{'measure':<{width}}{'unit':<7}"
    cell = max([len(v) for r in results.rows for v in r.shown.values()] + [18]) + 2
    head += "".join(f"{COLUMN_TITLES[m]:>{cell}}" for m in modes)
    ratios = max([len(r.ratios_shown()) for r in results.rows] + [6])
    targets = max([len(r.target.text) for r in results.rows if r.target] + [16]) + 2
    head += f"  {'baseline':>9} {'ratio':>{ratios}}  {'target':<{targets}}{'verdict':<7}"
    lines = [head, "-" * len(head)]
    notes: list[str] = []
    for row in results.rows:
        line = f"{row.label:<{width}}{row.unit:<7}"
        line += "".join(f"{row.shown.get(m, ''):>{cell}}" for m in modes)
        line += f"  {_fmt(row.baseline) if row.baseline else '':>9}"
        line += f" {row.ratios_shown():>{ratios}}"
        line += f"  {row.target.text if row.target else '':<{targets}}{row.verdict():<7}"
        lines.append(line)
        for note in row.notes:
            notes.append(f"  {row.label}: {note}")
        if row.baseline_label:
            notes.append(f"  {row.label}: baseline = {row.baseline_label}")
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def cpu_text(results: Results) -> str:
    """CPU time per message per process, one line per measurement."""
    entries = results.cpu_table()
    if not entries:
        return ""
    names: list[str] = []
    for entry in entries:
        for name in entry["us_per_msg"]:
            short = _short(name)
            if short not in names:
                names.append(short)
    cell = max(len(n) for n in names) + 2
    head = f"{'CPU µs per message':<44}{'mode':<5}" + "".join(f"{n:>{cell}}" for n in names)
    head += f"{'total':>9}{'cores':>7}"
    lines = [head, "-" * len(head)]
    for entry in entries:
        merged: dict[str, float] = {}
        for name, value in entry["us_per_msg"].items():
            merged[_short(name)] = merged.get(_short(name), 0.0) + value
        line = f"{entry['label'][:43]:<44}{entry['mode']:<5}"
        line += "".join(f"{_fmt(merged[n]) if n in merged else '':>{cell}}" for n in names)
        line += f"{_fmt(entry['total_us_per_msg']):>9}{entry['cores_busy'] or 0:>7.2f}"
        lines.append(line)
    lines.append("(consumer and handler columns add up every replica; cores = CPU s / wall s)")
    return "\n".join(lines)


def statements_text(results: Results, top: int = 15) -> str:
    """The busiest statements of each measurement, per message (``--statements``)."""
    lines: list[str] = []
    for entry in results.statements:
        lines += ["", f"{entry['label']} (tracing {entry['mode']}): "
                      f"{entry['calls_per_msg']:.2f} statements per message",
                  f"  {'calls/msg':>9} {'exec µs/msg':>11}  statement"]  # fmt: skip
        for st in entry["statements"][:top]:
            lines.append(f"  {st['calls_per_msg']:>9.3f} {st['exec_us_per_msg']:>11.1f}  "
                         f"{st['query'][:110]}")  # fmt: skip
    return "\n".join(lines).lstrip("\n")


def _short(name: str) -> str:
    """Column name of a process: its role, replicas and contexts merged."""
    for prefix in ("publisher", "consumer", "handler"):
        if name.startswith(prefix):
            return prefix
    return name


def write_json(results: Results, path: Path) -> None:
    path.write_text(json.dumps(results.to_json(), indent=2, default=str))
