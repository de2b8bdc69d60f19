"""The run's plots (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from bench.report import MODES, Results, _short


def draw_all(results: Results, out: Path) -> list[Path]:
    """Every plot there is data for; returns the files written."""
    written: list[Path] = []
    for draw in (latency_cdf, latency_percentiles, throughput, cpu_bars):
        path = draw(results, out)
        if path is not None:
            written.append(path)
    return written


def _mode_plot(results: Results, path: Path, panel: Callable[[Any, str], None]) -> Path | None:
    """A figure of one ``panel(ax, mode)`` per mode that has latency samples, written to
    ``path``; None (nothing written) when no mode has any."""
    modes = [m for m in MODES if any(results.samples.get(m, {}).values())]
    if not modes:
        return None
    fig, axes = plt.subplots(1, len(modes), figsize=(7 * len(modes), 5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        panel(ax, mode)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (PNG) and close it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_cdf(results: Results, out: Path) -> Path | None:
    """Distribution (CDF) of end-to-end latency per offered load, one panel per mode."""

    def panel(ax: Any, mode: str) -> None:
        for label, values in results.samples[mode].items():
            if not values:
                continue
            ordered = sorted(values)
            n = len(ordered)
            ax.plot(ordered, [(i + 1) / n for i in range(n)], label=f"{label} (n={n:,})")
        ax.set_xscale("log")
        ax.set_xlabel("occurred_at → processed (ms, log scale)")
        ax.set_ylabel("fraction of events")
        ax.set_title(_title("end-to-end latency", mode))
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="grey", linewidth=0.5, linestyle=":")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=8, loc="lower right")

    return _mode_plot(results, out / "latency_cdf.png", panel)


def latency_percentiles(results: Results, out: Path) -> Path | None:
    """p50 / p95 / p99 per offered load, bars, one panel per mode."""

    def panel(ax: Any, mode: str) -> None:
        series = {k: sorted(v) for k, v in results.samples[mode].items() if v}
        labels = list(series)
        for offset, (name, q) in enumerate((("p50", 0.5), ("p95", 0.95), ("p99", 0.99))):
            heights = [series[k][min(len(series[k]) - 1, int(q * len(series[k])))]
                       for k in labels]  # fmt: skip
            xs = [i + (offset - 1) * 0.27 for i in range(len(labels))]
            ax.bar(xs, heights, width=0.27, label=name)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        # Milliseconds at a light load, tens of seconds past saturation: on a linear axis
        # the light loads' bars — the ones the targets are about — would not show.
        ax.set_yscale("log")
        ax.set_ylim(bottom=1.0)  # bars rise from 1 ms, so their heights compare
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_ylabel("ms (log scale)")
        ax.set_title(_title("latency percentiles", mode))
        ax.legend()
        ax.grid(True, axis="y", which="both", linewidth=0.3)

    return _mode_plot(results, out / "latency_percentiles.png", panel)


def throughput(results: Results, out: Path) -> Path | None:
    """Every msg/s figure (baselines, Ferry per mode, the peer) as horizontal bars."""
    bars: list[tuple[str, float, str]] = []
    for row in results.rows:
        if row.unit not in ("msg/s", "txn/s", "req/s"):
            continue
        for mode in MODES:
            value = row.values.get(mode)
            if value is not None:
                suffix = "" if mode == "raw" else f" [tracing {mode}]"
                bars.append((row.label + suffix, value, mode))
    if not bars:
        return None
    colours = {"on": "tab:orange", "off": "tab:blue", "raw": "tab:grey"}
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(bars) + 1.5))
    names = [b[0] for b in bars][::-1]
    values = [b[1] for b in bars][::-1]
    ax.barh(names, values, color=[colours.get(b[2], "tab:grey") for b in bars][::-1])
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:,.0f}", va="center", fontsize=8)
    ax.set_xlabel("per second")
    ax.set_title("throughput: raw baselines, Ferry, faststream-outbox (same machine, same run)")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", linewidth=0.3)
    return _save(fig, out / "throughput.png")


def cpu_bars(results: Results, out: Path) -> Path | None:
    """CPU µs per message, stacked by process, per measurement."""
    entries = results.cpu_table()
    if not entries:
        return None
    names: list[str] = []
    for entry in entries:
        for name in entry["us_per_msg"]:
            if _short(name) not in names:
                names.append(_short(name))
    labels = [f"{e['label']} [{e['mode']}]" for e in entries]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(entries) + 1.5))
    left = [0.0] * len(entries)
    for name in names:
        widths = []
        for entry in entries:
            widths.append(sum(v for k, v in entry["us_per_msg"].items() if _short(k) == name))
        ax.barh(labels, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("CPU µs per message")
    ax.set_title("where the CPU goes, per process")
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", linewidth=0.3)
    return _save(fig, out / "cpu_per_message.png")


def _title(what: str, mode: str) -> str:
    return f"{what}, bare-bones pipeline" if mode == "raw" else f"{what}, tracing {mode}"
