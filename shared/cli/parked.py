"""``ferry parked``: the keys an ``ordering: key`` durable holds back, and their heads.

    ferry parked list    --durable D [--key K] [--limit N]   parked keys, oldest first: the
                                                              head, its state, how many wait
    ferry parked discard --durable D --key K --reason WHY [--actor A]

A key is parked when one of its events failed: that event (the head) and every later event
of the key wait in ``parked_messages`` (migration 0009) while the rest of the durable flows.
A ``retrying`` head is tried again by the consumer when its back-off ends; a ``held`` head
was dead-lettered under ``on_dead_letter: hold`` and waits for an operator: replay its dead
letter (``ferry dlq replay``: the replayed copy takes the head's place) or discard it here
(its later events then go on; its dead letter stays, for the audit). Every discard is
recorded in ``parked_actions`` with who, when and why. What it runs is
:mod:`shared.ops.parked`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import datetime
from typing import Any

from shared.cli.audit_args import actor_of, add_audit_args
from shared.ops.parked import discard_parked_head, parked_keys
from shared.runtime.settings import CommonSettings


async def _connect_note(settings: CommonSettings, durable: str) -> None:
    """The CLI's note on a durable that never parks anything (its name checked)."""
    if settings.load_topology().durable(durable).ordering != "key":
        print(
            f"note: {durable} is not declared `ordering: key`: nothing is ever parked for it",
            file=sys.stderr,
        )


def _line(row: dict[str, Any]) -> str:
    since: datetime | None = row["oldest_at"]
    at = since.strftime("%Y-%m-%d %H:%M:%S") if since else "-"
    behind = row["events"] - 1
    reason = " ".join(str(row["head_reason"] or "").split())[:120]
    return (
        f"{at}  p{row['partition']:<3} {row['ordering_key']}  head {row['head_id']} "
        f"{row['head_state']} x{row['head_attempts']}, {behind} waiting behind it"
        f"\n      {reason}"
    )


def _public(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, uuid.UUID):
            value = str(value)
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[key] = value
    out["waiting_behind"] = row["events"] - 1
    return out


async def cmd_list(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Parked keys of a durable, oldest first, with their heads."""
    await _connect_note(settings, args.durable)
    rows, summary = await parked_keys(settings, args.durable, args.ordering_key, args.limit)
    if args.json:
        doc = {
            "durable": args.durable,
            "keys": summary["keys"],
            "events": summary["events"],
            "held_keys": summary["held"],
            "parked": [_public(r) for r in rows],
        }
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    for row in rows:
        print(_line(row))
    print(
        f"{summary['keys']} key(s) parked, {summary['events']} event(s), "
        f"{summary['held']} held for an operator"
    )
    return 0


async def cmd_discard(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Discard a key's held head so its later events go on (audited)."""
    actor = actor_of(args)
    await _connect_note(settings, args.durable)
    gone = await discard_parked_head(
        settings, args.durable, args.ordering_key, actor=actor, reason=args.reason
    )
    if gone is None:
        print(
            f"refused: {args.durable} key {args.ordering_key!r} has no held head "
            "(not parked, or its head is retrying: see `ferry parked list`)",
            file=sys.stderr,
        )
        return 1
    print(f"discarded {args.durable} {args.ordering_key} head {gone}")
    return 0


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry parked ...`` on the ``ferry`` parser's subcommands."""
    top: argparse.ArgumentParser = sub.add_parser(
        "parked", help="keys an ordering: key durable holds back: list, discard a held head"
    )
    verbs = top.add_subparsers(dest="parked_command", required=True)
    lst = verbs.add_parser("list", help="parked keys, oldest first, with their heads")
    # dest is not "key": `ferry dlq`'s DURABLE MESSAGE_ID argument owns that name.
    lst.add_argument("--key", dest="ordering_key", help="one key (e.g. archive/A-17)")
    lst.add_argument("--limit", type=int, default=100, help="at most this many keys")
    lst.set_defaults(func=cmd_list)
    dis = verbs.add_parser("discard", help="drop a key's held head so the rest goes on")
    dis.add_argument(
        "--key", dest="ordering_key", required=True, help="the key whose held head to discard"
    )
    add_audit_args(dis)
    dis.set_defaults(func=cmd_discard)
    for parser in (lst, dis):
        parser.add_argument("--durable", required=True, help="an ordering: key durable")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
    return top
