"""The chaos run: ``python -m chaos.run [--schedule ci|soak] [--seconds N] [--seed S]``.

The command line of every chaos run (``--schedule custom --fault ...``, ``--scenario NAME``,
``--events N``, ``--out DIR`` too; ``--breaker on|off``, ``--outage-at T``, ``--outage S`` for
``--scenario handler-outage``). Without ``--scenario``, the ordinary run
(:mod:`chaos.scenarios.fault_schedule.run`): the faults of a seeded schedule while the
workload runs, then the drain and the count. With ``--scenario NAME``, that scenario
(:mod:`chaos.registry` says what runs each), small with ``--schedule ci``, long with
``--schedule soak``. Either prints its results and writes them to the run directory (a new
one under /tmp unless ``--out``), with every role's log.

Exit status: 0 when every invariant holds, 1 when one does not (the seed is printed so
the same plan can be run again), 2 when the run could not be set up, 130 interrupted.
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

from chaos.engine.config import RunConfig
from chaos.engine.results import report_line
from chaos.engine.schedule import FaultSpecError
from chaos.registry import SCENARIOS, run_scenario, scenario

log = logging.getLogger("chaos.run")
#: The scenario with options of its own.
OUTAGE = "handler-outage"


def _parser() -> argparse.ArgumentParser:
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
        choices=tuple(SCENARIOS),
        help="run one scenario instead (chaos.registry names the package of each):"
        " small with --schedule ci, long with --schedule soak",
    )
    outage = parser.add_argument_group(f"--scenario {OUTAGE}")
    outage.add_argument(
        "--breaker",
        choices=("on", "off"),
        help="the lane's circuit breaker (default on; off: the comparison arm)",
    )
    outage.add_argument(
        "--outage-at", type=float, metavar="T", help="seconds into the play the handler goes down"
    )
    outage.add_argument("--outage", type=float, metavar="S", help="seconds the handler stays down")
    parser.add_argument("--seconds", type=float, help="length of the fault phase")
    parser.add_argument("--events", type=int, help="events to commit over the fault phase")
    parser.add_argument("--seed", type=int, help="seed of the plan (default: random, printed)")
    parser.add_argument("--out", type=Path, help="run directory (default: a new one under /tmp)")
    parser.add_argument("--drain-timeout", type=float, help="seconds the drain may take")
    parser.add_argument(
        "--progress", type=float, default=5.0, help="seconds between progress lines"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = _parser()
    args = parser.parse_args(argv)
    if bool(args.fault) != (args.schedule == "custom"):
        parser.error("--fault goes with --schedule custom, and custom needs at least one --fault")
    outage = (args.breaker, args.outage_at, args.outage)
    if args.scenario != OUTAGE and any(o is not None for o in outage):
        parser.error(f"--breaker, --outage-at and --outage go with --scenario {OUTAGE}")
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
        breaker=None if args.breaker is None else args.breaker == "on",
        outage_at=args.outage_at,
        outage=args.outage,
    )
    return _run(config, args.scenario)


def _run(config: RunConfig, name: str | None) -> int:
    """Run it, print its results; the exit status."""
    if config.schedule not in scenario(name).schedules:
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    what = "chaos run" if name is None else "scenario"
    try:
        result = asyncio.run(run_scenario(config, name, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except FaultSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"{what} could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(result.render())
    print(f"\n{report_line(result)}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
