"""``ferry outbox``: the operator's commands for outbox rows the publisher set aside.

    ferry outbox list      --context C [--failed] [--limit N]   set-aside rows (and with
                                                                 no --failed, failing ones)
    ferry outbox republish --context C (--id ID ... | --all-failed) --reason WHY [--actor A]

A row is set aside when it cannot be published (reason codes PAYLOAD_INVALID,
MESSAGE_TOO_LARGE, PUBLISH_REFUSED, and on a partitioned stream ORDERING_KEY_MISSING: its
payload lacks the event's ``ordering_key`` field, so it has no partition; see
services/outbox_publisher/failures.py). The later rows of its aggregate wait behind it —
``list`` shows how many. ``republish`` makes it
pending again with 0 attempts (fix the row or the limits first, or it is set aside again)
and records who, when and why in ``outbox_actions``. What it runs is
:mod:`shared.ops.outbox`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from shared.cli.audit_args import actor_of, add_audit_args, uuid_argument
from shared.ops.outbox import republish, troubled_rows
from shared.runtime.settings import CommonSettings

_uuid = uuid_argument("an outbox event id")


def _line(row: dict[str, Any], status: str) -> str:
    since = row.get("set_aside_at") or row.get("last_attempt_at")
    at = since.strftime("%Y-%m-%d %H:%M:%S") if since else "-"
    error = " ".join(str(row["last_error"] or "").split())[:120]
    waiting = row.get("waiting")
    behind = f"  {waiting} waiting behind it" if waiting is not None else ""
    return (
        f"{at}  {row['seq']:>10} {row['id']}  {status:<17} x{row['attempts']:<5} "
        f"{row['aggregate_type']}/{row['aggregate_id']} {row['event_type']}.v"
        f"{row['event_version']}{behind}\n      last error: {error}"
    )


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}


async def cmd_list(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Set-aside rows (``--failed``), or set-aside and still failing ones, oldest first."""
    aside, failing = await troubled_rows(
        settings, args.context, args.limit, failed_only=args.failed
    )
    if args.json:
        doc = [{**_public(r), "status": "set_aside"} for r in aside]
        doc += [{**_public(r), "status": "failing"} for r in failing]
        print(json.dumps(doc, indent=2, default=str))
        return 0
    if not aside and not failing:
        print(f"no {'set-aside' if args.failed else 'set-aside or failing'} outbox rows "
              f"in {args.context}")  # fmt: skip
        return 0
    print(f"{'since':<19}  {'seq':>10} {'event id':<36}  {'status':<17} attempts  "
          "aggregate event")  # fmt: skip
    for row in aside:
        print(_line(row, f"set aside:{row['reason']}"))
    for row in failing:
        print(_line(row, "failing (retried)"))
    print(f"{len(aside)} set aside, {len(failing)} failing; republish a set-aside row with "
          f"`ferry outbox republish --context {args.context} --id ID --reason WHY`")  # fmt: skip
    return 0


async def cmd_republish(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Make set-aside rows pending again, audited; 1 when a named row is not set aside."""
    if not args.ids and not args.all_failed:
        print("ferry: name the rows to republish: --id ID (repeatable) or --all-failed",
              file=sys.stderr)  # fmt: skip
        return 2
    ids = None if args.all_failed else list(dict.fromkeys(args.ids))
    done = await republish(settings, args.context, ids, actor=actor_of(args), reason=args.reason)
    for row in done:
        print(f"republished {row['id']} (seq {row['seq']}, was {row['set_aside_reason']})")
    missing = [] if ids is None else sorted(set(ids) - {row["id"] for row in done}, key=str)
    for event_id in missing:
        print(f"refused: {event_id} is not a set-aside row of {args.context}", file=sys.stderr)
    if args.json:
        print(json.dumps({"republished": [str(r["id"]) for r in done],
                          "refused": [str(i) for i in missing]}))  # fmt: skip
    print(f"{len(done)} republished, {len(missing)} refused")
    return 1 if missing or not done else 0


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry outbox ...`` on the ``ferry`` parser's subcommands."""
    box: argparse.ArgumentParser = sub.add_parser(
        "outbox", help="outbox rows set aside by the publisher: list, republish"
    )
    verbs = box.add_subparsers(dest="outbox_command", required=True)
    lst = verbs.add_parser("list", help="set-aside (and failing) rows of a context")
    lst.add_argument("--failed", action="store_true", help="only rows set aside")
    lst.add_argument("--limit", type=int, default=1000, help="at most this many of each")
    lst.set_defaults(func=cmd_list)
    rep = verbs.add_parser("republish", help="make set-aside rows pending again (audited)")
    which = rep.add_mutually_exclusive_group()  # one of them: checked by cmd_republish
    which.add_argument("--id", dest="ids", type=_uuid, action="append", help="event id")
    which.add_argument("--all-failed", action="store_true", help="every set-aside row")
    add_audit_args(rep)
    rep.set_defaults(func=cmd_republish)
    for parser in (lst, rep):
        parser.add_argument("--context", required=True, help="the context whose outbox")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    return box
