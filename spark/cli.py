"""The KPI job's command line (``python -m spark.kpi_job`` / ``spark-submit spark/kpi_job.py``).

    python -m spark.kpi_job                          new complete windows of FERRY_TOPOLOGY
    python -m spark.kpi_job --topology A --topology B
    python -m spark.kpi_job --since 2026-01-01T00:00Z --until now     recompute a range
    python -m spark.kpi_job --every 1h               run forever, once an hour (supervisord)
    spark-submit --jars /usr/share/java/postgresql.jar spark/kpi_job.py [same options]

Prints a summary per topology and writes the reports (FERRY_KPI_REPORT_DIR). The exit
code is the verdict (see :mod:`spark.errors`): 0 pass, 1 a PRD-022 target missed, 4 an
INFRA-005 alert fired, 2/3/10-14 the job could not judge.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shared.domain.errors import ConfigurationError
from shared.runtime.logs import configure_logging
from spark.errors import EXIT_ALERT, EXIT_CONFIG, EXIT_OK, EXIT_SLO_BREACH, JobError
from spark.settings import KpiSettings
from spark.windows import parse_instant

log = logging.getLogger("ferry.kpi")
ROLE = "kpi-spark-job"


def parser() -> argparse.ArgumentParser:
    """The command line (settings come from FERRY_* / FERRY_KPI_*; options override)."""
    p = argparse.ArgumentParser(
        prog="python -m spark.kpi_job", description="Ferry's KPI and SLO job"
    )
    p.add_argument("--topology", type=Path, action="append",
                   help="topology file (repeatable; default FERRY_TOPOLOGY)")  # fmt: skip
    p.add_argument("--since", help="recompute from this instant (ISO 8601); keeps the watermark")
    p.add_argument("--until", help="recompute up to this instant (ISO 8601 or 'now')")
    p.add_argument("--as-of", help="judge as if it were this instant (ISO 8601)")
    p.add_argument("--window", help="window length, e.g. 1h, 15m, 10s (FERRY_KPI_WINDOW)")
    p.add_argument("--grace", help="grace period, e.g. 5m (FERRY_KPI_GRACE)")
    p.add_argument("--report-dir", type=Path, help="report directory (FERRY_KPI_REPORT_DIR)")
    p.add_argument("--dry-run", action="store_true",
                   help="compute and report, write nothing to the KPI tables")  # fmt: skip
    p.add_argument("--every", help="run forever at this interval, e.g. 1h (FERRY_KPI_EVERY)")
    once = "run once even if FERRY_KPI_EVERY is set (what each scheduled run does)"
    p.add_argument("--once", action="store_true", help=once)
    return p


def _settings(args: argparse.Namespace) -> KpiSettings:
    overrides: dict[str, Any] = {}
    for option, field in (("window", "kpi_window"), ("grace", "kpi_grace"),
                          ("report_dir", "kpi_report_dir"), ("every", "kpi_every")):  # fmt: skip
        value = getattr(args, option)
        if value is not None:
            overrides[field] = value
    return KpiSettings(**overrides)


def _instant(text: str | None, what: str) -> datetime | None:
    if text is None:
        return None
    if text.strip().lower() == "now":
        return datetime.now(UTC)
    return parse_instant(text, what)


def worst(codes: list[int]) -> int:
    """The exit code of several verdicts: a breach beats an alert beats a pass."""
    for code in (EXIT_SLO_BREACH, EXIT_ALERT):
        if code in codes:
            return code
    return EXIT_OK


def run_once(settings: KpiSettings, args: argparse.Namespace) -> int:
    """Check, start Spark, run every topology, print the summaries; return the verdict."""
    from spark.session import build_session, prepare_java

    topologies = args.topology or [settings.topology]
    since, until = _instant(args.since, "--since"), _instant(args.until, "--until")
    as_of = _instant(args.as_of, "--as-of")
    java = prepare_java(settings)
    from spark.runner import RunRequest, preflight, run_topology

    for topology in topologies:
        preflight(settings, topology)
    log.info("starting Spark", extra={"java": str(java.path), "java_version": java.major})
    spark = build_session(settings)
    codes = []
    try:
        for topology in topologies:
            request = RunRequest(topology, as_of=as_of, since=since, until=until,
                                 dry_run=args.dry_run)  # fmt: skip
            outcome = run_topology(spark, settings, request)
            print(outcome.summary, flush=True)
            codes.append(outcome.exit_code)
    finally:
        spark.stop()
    return worst(codes)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        settings = _settings(args)
    except ValidationError as exc:
        print(f"{ROLE}: configuration error:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(ROLE, settings.log_level)
    try:
        if settings.kpi_every is not None and not args.once:
            if args.since or args.until:
                raise ConfigurationError("--every cannot be combined with --since/--until")
            from spark.schedule import run_forever

            return run_forever(settings, child_argv(args))
        return run_once(settings, args)
    except JobError as exc:
        print(f"{ROLE}: {exc}", file=sys.stderr)
        log.error("run failed", extra={"exit_code": exc.exit_code, "error": str(exc)})
        return exc.exit_code
    except ConfigurationError as exc:
        print(f"{ROLE}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def child_argv(args: argparse.Namespace) -> list[str]:
    """The options a scheduled run passes on to each single run (which must not schedule)."""
    argv: list[str] = ["--once"]
    for topology in args.topology or []:
        argv += ["--topology", str(topology)]
    for option in ("window", "grace", "report_dir"):
        value = getattr(args, option)
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    if args.dry_run:
        argv.append("--dry-run")
    return argv
