"""``ferry dlq``: the operator's dead-letter commands (REQ-053, REQ-059, INFRA-005 §4.3).

    ferry dlq list     [FILTERS] [--limit N]            one line per dead letter
    ferry dlq show     DURABLE MESSAGE_ID               record, payload, history, actions
    ferry dlq replay   (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run] [--rate N]
    ferry dlq park     (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run]
    ferry dlq discard  (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run]
    ferry dlq edit     DURABLE MESSAGE_ID --payload-file PATH|- --reason WHY [--dry-run]
    ferry dlq export   [FILTERS] [--output FILE]        JSON lines, one record each

FILTERS: --durable D, --reason-code R, --status S (each repeatable), --subject PATTERN
(NATS wildcards), --since/--until (RFC 3339 time or a duration ago such as 2h).
Every change is recorded in ``dead_letter_actions`` with who (--actor, default the OS
user@host), when and why. A filter that would change more than one entry needs --all.

The commands live beside it: :mod:`shared.cli.dlq_read` (the filters as a query, ``list``,
``show`` and ``export``) and :mod:`shared.cli.dlq_change` (``replay``, ``park``,
``discard`` and ``edit``); what they run is :mod:`shared.ops.dlq`'s. This module holds the parser
(``add_dlq_commands``, ``check_key``).
"""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.cli.audit_args import nonempty_reason
from shared.cli.dlq_change import cmd_discard, cmd_edit, cmd_park, cmd_replay
from shared.cli.dlq_read import cmd_export, cmd_list, cmd_show, parse_uuid
from shared.domain.durations import parse_duration
from shared.ops.dlq import STATUSES


def _when(text: str) -> datetime:
    """An RFC 3339 time, or a duration meaning that long ago."""
    try:
        return datetime.now(UTC) - timedelta(seconds=parse_duration(text))
    except (ValueError, TypeError):
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an RFC 3339 time nor a duration such as 30m"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--durable", action="append", help="only this durable (repeatable)")
    parser.add_argument("--reason-code", action="append", help="e.g. HANDLER_REJECTED")
    parser.add_argument("--status", action="append", choices=STATUSES)
    parser.add_argument("--subject", help="original subject, NATS wildcards allowed")
    parser.add_argument("--since", type=_when, help="RFC 3339 time or a duration ago (2h)")
    parser.add_argument("--until", type=_when, help="RFC 3339 time or a duration ago")


def _change(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "key", nargs="*", metavar="DURABLE MESSAGE_ID", help="one dead letter (or use filters)"
    )
    _filters(parser)
    parser.add_argument("--reason", required=True, help="why (recorded with the action)")
    parser.add_argument("--actor", help="who (default: OS user@host)")
    parser.add_argument("--dry-run", action="store_true", help="show what would change")
    parser.add_argument("--all", action="store_true", help="allow changing several entries")


def add_dlq_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry dlq ...`` on the ``ferry`` parser's subcommands."""
    dlq: argparse.ArgumentParser = sub.add_parser(
        "dlq", help="inspect, replay, park, discard and export dead letters"
    )
    verbs = dlq.add_subparsers(dest="dlq_command", required=True)
    lst = verbs.add_parser("list", help="list dead letters")
    _filters(lst)
    lst.add_argument("--limit", type=int, help="at most this many")
    lst.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="one dead letter in full")
    show.add_argument("target_durable", metavar="DURABLE")
    show.add_argument("message_id", type=parse_uuid, metavar="MESSAGE_ID")
    show.set_defaults(func=cmd_show)
    replay = verbs.add_parser("replay", help="replay one, or every match of a filter")
    _change(replay)
    replay.add_argument("--rate", type=_positive, default=10.0, help="replays per second")
    replay.set_defaults(func=cmd_replay)
    park = verbs.add_parser("park", help="stop automatic replays of it")
    _change(park)
    park.set_defaults(func=cmd_park)
    discard = verbs.add_parser("discard", help="give up on it (kept for the audit)")
    _change(discard)
    discard.set_defaults(func=cmd_discard)
    edit = verbs.add_parser(
        "edit", help="replace one dead letter's payload and replay it (edit-and-retry)"
    )
    edit.add_argument("target_durable", metavar="DURABLE")
    edit.add_argument("message_id", type=parse_uuid, metavar="MESSAGE_ID")
    edit.add_argument(
        "--payload-file",
        required=True,
        metavar="PATH",
        help="the new payload, a JSON object (- reads standard input); checked against the "
        "schema of the event's type and version",
    )
    edit.add_argument("--reason", type=nonempty_reason, required=True, help="why (recorded)")
    edit.add_argument("--actor", help="who (default: OS user@host)")
    edit.add_argument(
        "--dry-run", action="store_true", help="check the edit and show it, change nothing"
    )
    edit.set_defaults(func=cmd_edit)
    export = verbs.add_parser("export", help="dead letters as JSON lines")
    _filters(export)
    export.add_argument("--output", help="file to write (default: stdout)")
    export.set_defaults(func=cmd_export)
    for parser in (lst, show, replay, park, discard, edit, export):
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    return dlq


def check_key(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A change command takes exactly DURABLE MESSAGE_ID, or none with filters."""
    key = getattr(args, "key", None)
    if key is None:
        return
    if len(key) not in (0, 2):
        parser.error("give DURABLE MESSAGE_ID (two values), or use filters")
    if key:
        try:
            uuid.UUID(key[1])
        except ValueError:
            parser.error(f"{key[1]!r} is not a message id (UUID)")
    args.key = tuple(key) if key else None
