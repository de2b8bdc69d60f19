"""The chaos run: ``python -m chaos.run [--schedule ci|soak] [--seconds N] [--seed S]``.

1. start a world of its own (:mod:`chaos.world`): PostgreSQL, nats-server, a Toxiproxy,
   and every role of sea-vibespro behind proxies;
2. for the schedule's duration, commit the planned events (:mod:`chaos.workload`) while
   injecting the planned faults (:mod:`chaos.faults`), restarting any role that dies by
   itself (and recording it), printing progress;
3. remove every toxic, make sure every server and role is up, and wait for the drain:
   every committed event settled, every JetStream consumer idle;
4. count everything (:mod:`chaos.accounting`), print the fault timeline and the summary,
   write them (``report.json``, ``summary.txt``, ``timeline.txt``) to the run directory.

Exit status: 0 when every invariant holds, 1 when one does not (the seed is printed so
the same plan can be run again), 2 when the run could not be set up.

The pieces live in sibling modules: :mod:`chaos.run_config` (:class:`RunConfig`,
:class:`RunResult`, :func:`make_schedule`), :mod:`chaos.run_engine` (:class:`Chaos`, the run
itself: fault phase, drain, counting) and :mod:`chaos.run_report` (the timeline, the summary and
the report files); this module holds the command line and re-exports them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

from chaos.run_config import RunConfig as RunConfig
from chaos.run_config import RunResult as RunResult
from chaos.run_config import make_schedule as make_schedule
from chaos.run_engine import PRODUCER_GRACE as PRODUCER_GRACE
from chaos.run_engine import QUIET_SECONDS as QUIET_SECONDS
from chaos.run_engine import REACH_ERRORS as REACH_ERRORS
from chaos.run_engine import Chaos as Chaos
from chaos.run_report import render_summary as render_summary
from chaos.run_report import render_timeline as render_timeline
from chaos.run_report import write_report as write_report
from chaos.schedule import FaultSpecError

log = logging.getLogger("chaos.run")

#: The 3-node JetStream cluster's scenarios (:mod:`chaos.scenario_cluster`).
CLUSTER_CHOICES = (
    "cluster",
    "cluster-leader",
    "cluster-meta-leader",
    "cluster-partition",
    "cluster-rolling",
    "cluster-ci",
)


async def run_chaos(config: RunConfig) -> RunResult:
    """Run one chaos run (see the module docstring)."""
    return await Chaos(config).run()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", choices=("ci", "soak", "custom"), default="ci")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="AT:KIND[:TARGET[:DURATION]]",
        help="a fault of the custom schedule (repeatable), e.g. 10:kill_nats",
    )
    parser.add_argument(
        "--scenario",
        choices=(
            "long-outage",
            "hostile-handler",
            "hostile-payloads",
            "ordering",
            "restore",
            *CLUSTER_CHOICES,
            "pg-failover",
        ),
        help="run one scenario instead (chaos.scenarios, chaos.scenario_ordering,"
        " chaos.scenario_restore, chaos.scenario_cluster for cluster*,"
        " chaos.scenario_pg_failover for pg-failover): small with"
        " --schedule ci, long with --schedule soak",
    )
    parser.add_argument("--seconds", type=float, help="length of the fault phase")
    parser.add_argument("--events", type=int, help="events to commit over the fault phase")
    parser.add_argument("--seed", type=int, help="seed of the plan (default: random, printed)")
    parser.add_argument("--out", type=Path, help="run directory (default: a new one under /tmp)")
    parser.add_argument("--drain-timeout", type=float, help="seconds the drain may take")
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines"
    )
    args = parser.parse_args(argv)
    if bool(args.fault) != (args.schedule == "custom"):
        parser.error("--fault goes with --schedule custom, and custom needs at least one --fault")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**9)
    run_dir = args.out or Path(tempfile.gettempdir()) / "ferry-chaos" / (
        f"{args.scenario or args.schedule}-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=run_dir / "chaos.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config = RunConfig(
        schedule=args.schedule,
        seed=seed,
        seconds=args.seconds,
        events=args.events,
        run_dir=run_dir,
        drain_timeout=args.drain_timeout,
        progress_every=args.progress,
        faults=tuple(args.fault),
    )
    if args.scenario == "pg-failover":
        from chaos.scenario_pg_failover import main_failover  # it imports this module

        return main_failover(config)
    if args.scenario in CLUSTER_CHOICES:
        from chaos.scenario_cluster import main_cluster  # it imports this module

        return main_cluster(config, args.scenario)
    if args.scenario is not None:
        return _main_scenario(config, args.scenario)
    try:
        result = asyncio.run(run_chaos(config))
    except KeyboardInterrupt:
        print(f"interrupted (seed {seed}); logs in {run_dir}", file=sys.stderr)
        return 130
    except FaultSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"chaos run could not be set up (seed {seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print("Fault timeline")
    print(render_timeline(result.timeline))
    print()
    print(result.summary)
    print(f"\nreport: {run_dir}/report.json, summary.txt, timeline.txt, logs/")
    return 0 if result.ok else 1


def _main_scenario(config: RunConfig, scenario: str) -> int:
    """``--scenario``: run it, print its results table; exit 0 when every invariant holds."""
    from chaos.scenario_report import render_table
    from chaos.scenarios import run_scenario  # it imports this module: imported late

    if config.schedule not in ("ci", "soak"):
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_scenario(config, scenario, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"scenario could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(render_table(result))
    print(f"\nreport: {config.run_dir}/scenario.json, scenario.txt, fates.json, logs/")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
