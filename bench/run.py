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
``soak``       resident memory of every role over ``--soak-seconds``

Issue 29's figures, each a ratio to a baseline of the same run, are judged per tracing
mode (:mod:`bench.ratios`). Every Ferry section runs once per tracing mode (``--tracing
both``: 10 % parent-based sampling exported over OTLP, and off). Prints a table and the
CPU time per message per process, and writes ``results.json``, ``table.txt``, the plots
and the roles' logs into ``--out`` (default ``bench/results/<time>/``, with
``bench/results/latest`` pointing there). Exit status 0 when every section ran, 1 when
one failed (the others still ran).
"""

from __future__ import annotations

import argparse
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
from bench.world import Servers, set_traces_ratio, traces_ratio

SECTIONS = (
    "baselines",
    "prototype",
    "peer",
    "publisher",
    "drain",
    "latency",
    "sustained",
    "mediation",
    "soak",
)
RESULTS = ROOT / "bench" / "results"

#: Sizes of a full run, and of ``--quick`` (a smoke run of a minute or two).
FULL = {"rows": 100_000, "seconds": 30.0, "sustain_start": 1200, "sustain_step": 300,
        "sustain_max": 4000, "soak_seconds": 600.0, "soak_rate": 1000, "warmup": 5.0,
        "baseline_seconds": 10.0}  # fmt: skip
QUICK = {"rows": 1000, "seconds": 2.0, "sustain_start": 300, "sustain_step": 300,
         "sustain_max": 600, "soak_seconds": 6.0, "soak_rate": 200, "warmup": 1.0,
         "baseline_seconds": 1.5}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Ferry's benchmark: roles as processes, raw baselines, one table.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke-run sizes (seconds, not minutes); explicit flags still win",
    )
    parser.add_argument("--rows", type=int, help="backlog size of the drains (100,000)")
    parser.add_argument(
        "--peer-rows", type=int, help="backlog of the faststream-outbox drain (default: --rows)"
    )
    parser.add_argument("--seconds", type=float, help="duration of each fixed-rate step (30)")
    parser.add_argument(
        "--rates",
        default="600,1000,1500",
        help="offered loads of the latency section, msg/s (600,1000,1500)",
    )
    parser.add_argument(
        "--mediation-rate",
        type=int,
        default=600,
        help="offered load into lane E→F, forwarded F→G (600)",
    )
    parser.add_argument("--sustain-start", type=int, help="first step of the search (1200)")
    parser.add_argument("--sustain-step", type=int, help="increment of the search (300)")
    parser.add_argument("--sustain-max", type=int, help="ceiling of the search (4000)")
    parser.add_argument("--soak-seconds", type=float, help="length of the soak (600)")
    parser.add_argument("--soak-rate", type=int, help="offered load of the soak (1000)")
    parser.add_argument("--warmup", type=float, help="warm-up at 200 msg/s before latency (5)")
    parser.add_argument(
        "--baseline-seconds", type=float, help="duration of the PostgreSQL and HTTP baselines (10)"
    )
    parser.add_argument(
        "--tracing",
        choices=["on", "off", "both"],
        default="both",
        help="tracing modes of the Ferry sections (both)",
    )
    parser.add_argument(
        "--trace-ratio", type=float, default=0.1,
        help="sampling ratio of tracing on: the roles' parentbased_traceidratio and the "
        "share of backlog rows stored with a sampled traceparent (0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, from: {', '.join(SECTIONS)} (all)",
    )
    parser.add_argument("--skip", default="", help="comma-separated sections to leave out")
    parser.add_argument(
        "--peer-workers", type=int, default=32, help="faststream-outbox max_workers (32)"
    )
    parser.add_argument(
        "--producer-connections", type=int, default=16,
        help="the producer's pool: one transaction per event on each (16)",
    )  # fmt: skip
    parser.add_argument(
        "--producer-form", choices=("transaction", "statement"), default="transaction",
        help="each event as a transaction (BEGIN, upsert, record_event, COMMIT: an "
        "application's usual form) or as one statement (record_event_with)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-budget", type=float, default=600.0,
        help="longest wait for one drain; a slower one is reported as partial (600 s)",
    )  # fmt: skip
    parser.add_argument(
        "--statements", action="store_true",
        help="load pg_stat_statements and write each measurement's statements per message "
             "to statements.txt (a profiling aid: it costs PostgreSQL some CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="role_settings", action="append", default=[], metavar="FERRY_NAME=VALUE",
        help="a setting every role gets, e.g. FERRY_LINGER=0 (repeatable; recorded in "
             "results.json): for comparing settings on the same machine",
    )  # fmt: skip
    parser.add_argument(
        "--ordered-partitions", type=int, default=4,
        help="partitions of the ordered drain's stream (4)",
    )  # fmt: skip
    parser.add_argument(
        "--ordered-replicas", type=int, default=2,
        help="consumer replicas of the ordered drain (2)",
    )  # fmt: skip
    parser.add_argument(
        "--handler-batch", type=int, default=50,
        help="events per handler call in the batch-call drain (handler.batch; 50)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-pairs", type=int, default=2,
        help="with --tracing both, times the one-consumer drain runs in each mode, in "
        "pairs whose order alternates (on, off, off, on): its figures are all events "
        "over all their time (2)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="output directory (bench/results/<time>)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (server data) for inspection",
    )
    return parser.parse_args(argv)


def options_from(args: argparse.Namespace) -> s.Options:
    sizes = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return sizes[name] if value is None else value

    chosen = {x.strip() for x in args.sections.split(",") if x.strip()}
    chosen -= {x.strip() for x in args.skip.split(",") if x.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections: unknown {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(SECTIONS)}")  # fmt: skip
    try:
        rates = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        raise SystemExit(
            f"--rates: {args.rates!r} is not a comma-separated list of integers"
        ) from None
    rows = int(pick("rows"))
    if not 2 <= args.handler_batch <= 1000:
        raise SystemExit("--handler-batch must be between 2 and 1000")
    if not 1 <= args.drain_pairs <= 10:
        raise SystemExit("--drain-pairs must be between 1 and 10")
    if args.ordered_partitions < 1 or args.ordered_replicas < 1:
        raise SystemExit("--ordered-partitions and --ordered-replicas must be at least 1")
    modes = ["on", "off"] if args.tracing == "both" else [args.tracing]
    if not 0.0 <= args.trace_ratio <= 1.0:
        raise SystemExit("--trace-ratio must be between 0 and 1")
    set_traces_ratio(args.trace_ratio)
    return s.Options(
        rows=rows, peer_rows=args.peer_rows or rows, seconds=float(pick("seconds")),
        rates=rates, mediation_rate=args.mediation_rate,
        sustain_start=int(pick("sustain_start")), sustain_step=int(pick("sustain_step")),
        sustain_max=int(pick("sustain_max")), soak_seconds=float(pick("soak_seconds")),
        soak_rate=int(pick("soak_rate")), warmup_seconds=float(pick("warmup")),
        modes=modes, sections=chosen, peer_workers=args.peer_workers,
        drain_budget=args.drain_budget, producer_connections=args.producer_connections,
        producer_form=args.producer_form,
        baseline_seconds=float(pick("baseline_seconds")), statements=args.statements,
        role_settings=role_settings(args.role_settings),
        ordered_partitions=args.ordered_partitions, ordered_replicas=args.ordered_replicas,
        handler_batch=args.handler_batch, drain_pairs=args.drain_pairs,
    )  # fmt: skip


#: Settings the bench gives the roles itself: a --set of one would break the deployment.
BENCH_OWNED = frozenset(
    {"topology", "nats_url", "databases", "health_port", "handler_url", "max_stream_replicas",
     "max_stream_bytes", "log_level", "traces_exporter", "otlp_protocol", "otlp_endpoint",
     "traces_sampler", "traces_sampler_arg"}
)  # fmt: skip
#: OpenTelemetry SDK variables a role's tracing reads as is (the batch span processor's).
OTEL_PASSED = ("OTEL_BSP_",)


def role_settings(pairs: list[str]) -> dict[str, str]:
    """``--set FERRY_NAME=VALUE`` pairs, each naming a setting some role reads.

    ``OTEL_BSP_*`` (the SDK's batch span processor: export delay, batch and queue sizes)
    pass as well, unchecked beyond their prefix: the SDK reads them itself.
    """
    from services.handlers.settings import HandlerSettings
    from shared.runtime import settings as ferry

    known: set[str] = set()
    for cls in (ferry.PublisherSettings, ferry.ConsumerSettings, ferry.RouterSettings,
                ferry.ReplayerSettings, HandlerSettings):  # fmt: skip
        known.update(cls.model_fields)
    chosen: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        field_name = name.removeprefix("FERRY_").lower()
        if sep and name.startswith(OTEL_PASSED) and value.strip():
            chosen[name] = value.strip()
            continue
        if not sep or not name.startswith("FERRY_") or not value.strip():
            raise SystemExit(f"--set {pair!r}: expected FERRY_NAME=VALUE, e.g. FERRY_LINGER=0")
        if field_name in BENCH_OWNED:
            raise SystemExit(f"--set {name}: the bench sets this one itself")
        if field_name not in known:
            raise SystemExit(f"--set {name}: no role has a setting {field_name!r} "
                             "(see docs/reference/settings.md)")  # fmt: skip
        chosen[name] = value.strip()
    return chosen


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
    if "soak" in sections:
        plan.append((f"soak [{modes[0]}]", partial(s.soak, bench, modes[0])))
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
