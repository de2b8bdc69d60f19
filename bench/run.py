"""``python -m bench``: Ferry's benchmark, in one run, beside the raw baselines.

Starts its own nats-server (file store, ``sync_interval: always``) and PostgreSQL
(default durability settings) in a temporary directory, runs Ferry's roles as real
processes and the load generator in a process of its own, and measures, by section:

``baselines``  raw JetStream publish and pull consume + ack, the PostgreSQL state+outbox
               transaction over 8 connections, the HTTP round trip to the example handler;
               after every other section, the transaction and POST /handle once more
               (the machine's drift over the run, end ÷ start)
``prototype``  the bare-bones pipeline (:mod:`bench.prototype`) at each of ``--rates``,
               then (with ``sustained``) its highest sustained rate: the same-machine
               yardstick of the latency and sustained figures
``peer``       faststream-outbox relaying the same backlog into JetStream
``publisher``  outbox-publisher drain of a ``--rows`` backlog
``drain``      end-to-end drain of a ``--rows`` backlog with one (``--drain-pairs`` pairs
               of runs with both tracing modes, order alternating) and two consumer replicas,
               one consumer with batch handler calls (``--handler-batch`` events per POST,
               judged against the raw per-message POST /handle), and ordered (``ordering:
               key``, 1,000 keys, ``--ordered-partitions`` partitions, ``--ordered-replicas``
               replicas) against the unordered drain
``latency``    end-to-end latency at each of ``--rates`` offered by the producer
``sustained``  the highest rate the pipeline holds with the producer on the box
``mediation``  lanes E→F and F→G of the mediation topology together
``tls``        issue 47: the publisher drain and the one-consumer drain (``--tls-pairs``
               pairs of each) and the latency at ``--tls-rate`` msg/s with TLS off and on
               (NATS over ``tls://``, the handler over HTTPS; PostgreSQL plain text), each
               arm on a fresh nats-server of its own; each figure TLS on ÷ off
``soak``       resident memory of every role over ``--soak-seconds``
``retention-soak``  issue 48, only when named: ``--soak-seconds`` at ``--soak-rate`` with
               every retention cut to ``--soak-retention`` seconds and the retention role
               running; database sizes and resident memory over the second half, and a
               plot of table sizes over time
``volume``     issue 48, only when named: each hot path (publisher and consumer drains, p99
               at 600 msg/s, the console's pages, ``ferry where``, the drainer's round) on
               empty tables and after seeding a year of history (``--volume-scale``)

Issue 29's figures, each a ratio to a baseline of the same run, are judged per tracing
mode (:mod:`bench.ratios`). Every Ferry section runs once per tracing mode (``--tracing
both``: 10 % parent-based sampling exported over OTLP, and off). Prints a table and the
CPU time per message per process, and writes ``results.json``, ``table.txt``, the plots
and the roles' logs into ``--out`` (default ``bench/results/<time>/``, with
``bench/results/latest`` pointing there). Exit status 0 when every section ran, 1 when
one failed (the others still ran).

This module runs the sections in order and writes the results; the command line (the
sections, the full and ``--quick`` sizes, the flags and their checks into the run's
options) is in :mod:`bench.run_options`.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench import sections as s
from bench.common import ROOT, machine_share, machine_times, say
from bench.finish import finish
from bench.plots import draw_all
from bench.procs import kill_leftovers
from bench.report import Results, cpu_text, statements_text, table, write_json
from bench.run_options import options_from as options_from
from bench.run_options import parse_args as parse_args
from bench.run_options import role_settings as role_settings
from bench.world import Servers, traces_ratio

RESULTS = ROOT / "bench" / "results"


def meta(options: s.Options) -> dict[str, Any]:
    def output(*argv: str) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except OSError as exc:
            return f"unavailable: {exc}"
        text = (done.stdout or done.stderr).strip()
        return text.splitlines()[0] if text else ""

    from devstack.nats import nats_server_binary
    from devstack.postgres import install_dir

    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(), "python": sys.version.split()[0],
        "git_commit": output("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"),
        "nats_server": output(str(nats_server_binary()), "--version"),
        "postgres": output(str(install_dir() / "bin" / "postgres"), "--version"),
        "server_settings": "nats-server file store, sync_interval: always; PostgreSQL "
                           "defaults (fsync on, synchronous_commit on)",
        "tracing_on": f"OTLP/HTTP to a local sink, parentbased_traceidratio {traces_ratio()}",
        "options": {k: (sorted(v) if isinstance(v, set) else v)
                    for k, v in vars(options).items()},
    }  # fmt: skip


async def run(options: s.Options, out: Path, keep: bool) -> Results:
    # SIGTERM and Ctrl-C cancel the run: roles are stopped, the servers too, and
    # main() kills whatever child is still alive.
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    results = Results(meta(options))
    base = _scratch()
    logs = out / "logs"
    say(f"servers in {base}; results in {out}")
    try:
        with Servers(base, statements=options.statements) as servers:
            if "on" in options.modes:
                await servers.start_sink(logs)
            bench = s.Bench(servers, options, results, logs)
            try:
                await _sections(bench)
            except asyncio.CancelledError:
                # What was measured before the signal is still reported.
                results.errors.append("interrupted by a signal: later sections did not run")
                say("interrupted: writing what was measured")
            finally:
                await servers.stop_sink()
    finally:
        if keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    finish(bench)
    results.meta["load_average_at_end"] = os.getloadavg()
    return results


def _scratch() -> Path:
    base = Path(tempfile.mkdtemp(prefix="ferry-bench-"))
    base.chmod(0o711)  # PostgreSQL's unprivileged user must reach its data directory
    return base


Plan = list[tuple[str, Callable[[], Awaitable[None]]]]


async def _sections(bench: s.Bench) -> None:
    plan = _plan(bench)
    machine = bench.results.meta.setdefault("machine_cpu_percent", {})
    first = machine_times()
    for number, (name, step) in enumerate(plan, 1):
        say(f"=== {number}/{len(plan)}: {name}")
        before = machine_times()
        try:
            await step()
        except Exception as exc:  # one failed section is reported; the others still run
            bench.results.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            say(f"  FAILED: {type(exc).__name__}: {exc}")
        machine[name] = share = machine_share(before, machine_times())
        if share:
            say(f"  machine: busy {100 - share['idle']:.0f} %, steal {share['steal']} %")
    machine["whole run"] = machine_share(first, machine_times())


def _plan(bench: s.Bench) -> Plan:
    """The sections to run, in order: mode-independent first, then each measurement in
    both tracing modes back to back, the first mode alternating from one measurement to
    the next (on, off; off, on; ...). The machine's speed drifts over a run (other tenants
    of the VM): measured side by side, a ratio of the two modes compares like with like,
    and a drift over the run weighs on both modes alike."""
    sections, modes = bench.options.sections, bench.options.modes
    plan: Plan = []
    if "baselines" in sections:
        plan.append(("baselines", partial(s.baselines, bench)))
    if "prototype" in sections:
        plan.append(("prototype", partial(s.prototype, bench)))
    if "peer" in sections:
        plan.append(("peer", partial(s.peer, bench)))
    for index, (name, make) in enumerate(_measurements(bench)):
        order = list(modes) if index % 2 == 0 else list(reversed(modes))
        plan.extend((f"{name} [{mode}]", make(mode)) for mode in order)
    if "tls" in sections:
        # Once, in one tracing mode (off when the run has it): TLS on ÷ off is the figure.
        mode = "off" if "off" in modes else modes[0]
        plan.append((f"tls [{mode}]", partial(s.tls, bench, mode)))
    if "volume" in sections:
        # Once, in one tracing mode (off when the run has it): at volume ÷ empty is the figure.
        mode = "off" if "off" in modes else modes[0]
        plan.append((f"volume [{mode}]", partial(s.volume, bench, mode)))
    if "soak" in sections:
        plan.append((f"soak [{modes[0]}]", partial(s.soak, bench, modes[0])))
    if "retention-soak" in sections:
        plan.append((f"retention-soak [{modes[0]}]", partial(s.retention_soak, bench, modes[0])))
    if "baselines" in sections and len(plan) > 1:
        # The machine's drift over the run: two baselines again, beside their first figures.
        plan.append(("baselines again", partial(s.baselines_again, bench)))
    return plan


def _measurements(
    bench: s.Bench,
) -> list[tuple[str, Callable[[str], Callable[[], Awaitable[None]]]]]:
    """The sections measured in each tracing mode, in order: (name, step of a mode)."""
    sections = bench.options.sections
    steps: list[tuple[str, Callable[[str], Callable[[], Awaitable[None]]]]] = []
    if "publisher" in sections:
        steps.append(("publisher", lambda m: partial(s.publisher_drain, bench, m)))
    if "drain" in sections:
        steps.append(("drain x1", lambda m: partial(s.e2e_drain, bench, m, 1)))
        # Its figures make two of issue 29's ratios (÷ raw POST /handle, tracing on ÷ off):
        # with both modes, further pairs right behind, their order alternating, so the
        # VM's drift over a few minutes weighs on both modes alike.
        pairs = bench.options.drain_pairs if len(bench.options.modes) == 2 else 1
        steps.extend(
            (f"drain x1, pair {n}", lambda m: partial(s.e2e_drain, bench, m, 1))
            for n in range(2, pairs + 1)
        )
        steps.append(("drain batch x1", lambda m: partial(s.batch_drain, bench, m)))
        steps.append(("drain x2", lambda m: partial(s.e2e_drain, bench, m, 2)))
        steps.append(("drain ordered", lambda m: partial(s.ordered_drain, bench, m)))
    if sections & {"latency", "sustained"}:
        steps.append(("latency", lambda m: partial(s.latency, bench, m)))
    if "mediation" in sections:
        steps.append(("mediation", lambda m: partial(s.mediation, bench, m)))
    return steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = options_from(args)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / stamp
    (out / "logs").mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        results = asyncio.run(run(options, out, args.keep))
    except asyncio.CancelledError:
        print("interrupted: servers stopped, nothing written", file=sys.stderr)
        return 130
    finally:
        kill_leftovers()
    results.meta["wall_seconds"] = round(time.monotonic() - began, 1)
    text = table(results) + "\n\n" + cpu_text(results)
    whole = results.meta.get("machine_cpu_percent", {}).get("whole run")
    if whole:
        text += (f"\nmachine over the run: busy {100 - whole['idle']:.0f} %, hypervisor steal "
                 f"{whole['steal']} % of CPU time (per section: results.json meta)")  # fmt: skip
    if results.errors:
        text += "\n\nerrors:\n" + "\n".join(f"  {e}" for e in results.errors)
    print("\n" + text)
    (out / "table.txt").write_text(text + "\n")
    write_json(results, out / "results.json")
    if results.statements:
        (out / "statements.txt").write_text(statements_text(results) + "\n")
    plots = draw_all(results, out)
    if args.out is None:
        latest = RESULTS / "latest"
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(out.name)
    print(f"\nwrote {out / 'results.json'}, {out / 'table.txt'}"
          + (", statements.txt" if results.statements else "")
          + "".join(f", {p.name}" for p in plots))  # fmt: skip
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
