"""``ferry purge [SCOPE] [--dry-run] [--every DURATION]``: delete the rows past their
retention, once or forever at an interval; what and how is :mod:`shared.ops.purge`'s."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from shared.domain.durations import parse_duration
from shared.ops.purge import DEFAULT_BATCH, purge, purge_forever
from shared.runtime.logs import configure_logging
from shared.runtime.settings import CommonSettings


async def cmd_purge(settings: CommonSettings, args: argparse.Namespace) -> int:
    """``ferry purge``: print what was (or would be) purged, per table and scope."""
    if args.batch < 1:
        raise SystemExit("ferry purge: --batch must be at least 1")
    if args.every is not None:
        if args.dry_run:
            raise SystemExit("ferry purge: --every cannot be combined with --dry-run")
        every = _interval(args.every)
        configure_logging("retention", settings.log_level)
        return await purge_forever(settings, every, batch=args.batch, only=args.scope)
    report = await purge(settings, batch=args.batch, dry_run=args.dry_run, only=args.scope)
    if args.json:
        doc = {"dry_run": args.dry_run, "tables": [asdict(p) for p in report]}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print("\n".join(p.line(args.dry_run) for p in report) or "nothing to purge")
    return 0


def add_purge_command(sub: Any) -> None:
    """Register ``ferry purge`` on the CLI's subparsers."""
    cmd = sub.add_parser(
        "purge",
        help="delete the rows past their retention: published outbox rows, processed inbox "
        "rows, old audit rows, handler claims (docs/reference/topology.md)",
    )
    cmd.add_argument(
        "scope", nargs="?", help="one context (its databases' tables) or durable (default: all)"
    )
    cmd.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    cmd.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows per statement")
    cmd.add_argument(
        "--every",
        metavar="DURATION",
        help="run forever: purge now, then at this interval (e.g. 1h), logging JSON lines",
    )
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=cmd_purge)


def _interval(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"ferry purge: --every {text!r}: {exc}") from None
    if seconds < 1:
        raise SystemExit(f"ferry purge: --every {text!r}: at least one second")
    return seconds
