"""What the processes of a measurement spent: CPU time, and batch sizes from /metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import psutil


class CpuBook:
    """CPU seconds (user + system) of named processes, readable at any moment.

    A process registered as a tree (PostgreSQL's postmaster) counts itself, its live
    children and every child it has reaped, so backends that come and go between two
    readings are counted too. A process that exited keeps its last reading.
    """

    def __init__(self) -> None:
        self._procs: dict[str, tuple[psutil.Process, bool]] = {}
        self._last: dict[str, float] = {}

    def add(self, name: str, pid: int, *, tree: bool = False) -> None:
        """Follow ``pid`` under ``name``."""
        with contextlib.suppress(psutil.Error):
            self._procs[name] = (psutil.Process(pid), tree)
            self._last[name] = self._read(name)

    def forget(self, name: str) -> None:
        """Stop following ``name``."""
        self._procs.pop(name, None)

    def _read(self, name: str) -> float:
        proc, tree = self._procs[name]
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                total = times.user + times.system
                if tree:
                    total += times.children_user + times.children_system
                    for child in proc.children(recursive=True):
                        with contextlib.suppress(psutil.Error):
                            child_times = child.cpu_times()
                            total += child_times.user + child_times.system
        except psutil.Error:
            return self._last.get(name, 0.0)
        self._last[name] = float(total)
        return float(total)

    def snapshot(self) -> dict[str, float]:
        """Every followed process's CPU seconds now."""
        return {name: self._read(name) for name in list(self._procs)}

    def rss(self) -> dict[str, int]:
        """Resident memory (bytes) of every followed process that is not a tree."""
        out: dict[str, int] = {}
        for name, (proc, tree) in list(self._procs.items()):
            if not tree:
                with contextlib.suppress(psutil.Error):
                    out[name] = int(proc.memory_info().rss)
        return out


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two snapshots."""
    return {name: round(after[name] - before.get(name, 0.0), 3) for name in after}


BATCH_HISTOGRAMS = ("ferry_outbox_batch_rows", "ferry_consumer_batch_messages")


def batch_histogram(text: str) -> tuple[float, float] | None:
    """(count, sum) of the batch-size histogram in a /metrics text, or None if it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    count = total = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        if family.name not in BATCH_HISTOGRAMS:
            continue
        for sample in family.samples:
            if sample.name == family.name + "_count":
                count += sample.value
                found = True
            elif sample.name == family.name + "_sum":
                total += sample.value
    return (count, total) if found else None


def batch_delta(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Batches, messages and the mean batch of each role between two :meth:`batch_counts`."""
    return {
        name: {"batches": batches, "messages": messages, "mean": messages / batches}
        for name, (batches, messages) in pair_delta(before, after).items()
    }


def pair_delta(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """Each key's pair of running totals (a count, and a sum) between two snapshots: the
    keys whose count grew (a key missing ``before`` counts from zero)."""
    out = {}
    for key, (count, total) in after.items():
        count0, total0 = before.get(key, (0.0, 0.0))
        if count > count0:
            out[key] = (count - count0, total - total0)
    return out
