"""The reading ``ferry dlq`` commands (see :mod:`shared.cli.dlq`): the filters as a query,
a row as one line, and ``list``, ``show`` and ``export`` over :mod:`shared.ops.dlq`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from shared.adapters import dead_letters as store
from shared.cli.audit_args import uuid_argument
from shared.contracts.topology import Topology
from shared.ops.dlq import find_dead_letters, public, show_dead_letter
from shared.runtime.settings import CommonSettings

#: A message id argument (``ferry dlq``'s, ``ferry where``'s).
parse_uuid = uuid_argument("a message id")


def query_from_args(topology: Topology, args: argparse.Namespace) -> store.Query:
    durables = list(args.durable or [])
    for name in durables:
        topology.durable(name)  # ConfigurationError naming the known ones
    ids = list(getattr(args, "message_ids", None) or [])
    return store.Query(
        durables=durables,
        reasons=list(args.reason_code or []),
        statuses=list(args.status or []),
        subject=args.subject,
        since=args.since,
        until=args.until,
        message_ids=ids,
        limit=getattr(args, "limit", None),
    )


def row_line(row: dict[str, Any]) -> str:
    at = row["dead_lettered_at"].strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{at}  {row['durable']:<24} {row['message_id']}  {row['status']:<9} "
        f"{row['reason_code']:<24} x{row['replay_attempts']}  {row['original_subject']}"
    )


async def cmd_list(settings: CommonSettings, args: argparse.Namespace) -> int:
    """List dead letters matching the filters, oldest first."""
    rows = await find_dead_letters(settings, query_from_args(settings.load_topology(), args))
    if args.json:
        print(json.dumps([public(r) for r in rows], indent=2, default=str))
    elif not rows:
        print("no dead letters match")
    else:
        print(f"{'dead-lettered at':<19}  {'durable':<24} {'message id':<36}  status    reason")
        for row in rows:
            print(row_line(row))
        print(f"{len(rows)} dead letter(s)")
    return 0


async def cmd_export(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Matching dead letters as JSON lines (to --output or stdout)."""
    rows = await find_dead_letters(settings, query_from_args(settings.load_topology(), args))
    lines = [json.dumps(public(r), default=str, sort_keys=True) for r in rows]
    if args.output:
        text = "".join(line + "\n" for line in lines)
        await asyncio.to_thread(Path(args.output).write_text, text, encoding="utf-8")
        print(f"exported {len(lines)} dead letter(s) to {args.output}", file=sys.stderr)
    else:
        for line in lines:
            print(line)
    return 0


async def cmd_show(settings: CommonSettings, args: argparse.Namespace) -> int:
    """One dead letter in full: record (payload, history), trace id, operator actions."""
    row = await show_dead_letter(settings, args.target_durable, args.message_id)
    if row is None:
        print(f"ferry: no dead letter {args.target_durable}/{args.message_id}", file=sys.stderr)
        return 1
    done = row["actions"]
    ordering = row["ordering"]
    if args.json:
        print(json.dumps(row, indent=2, default=str))
        return 0
    record = row.pop("record")
    for key in (
        "durable", "message_id", "status", "reason_code", "last_error", "original_subject",
        "stream", "stream_seq", "attempts", "generation", "replay_attempts", "next_replay_at",
        "dead_lettered_at", "source", "trace_id",
    ):  # fmt: skip
        print(f"{key:>17}: {row.get(key)}")
    if ordering is not None:
        print(f"{'ordering':>17}: {_ordering_line(ordering)}")
    print("    retry history:")
    for entry in record.get("retryHistory", []):
        print(f"      {json.dumps(entry, default=str)}")
    print("   replay history:")
    for entry in row.get("replay_history", []):
        print(f"      {json.dumps(entry, default=str)}")
    print("          actions:")
    for action in done:
        print(f"      {action['at']} {action['action']} by {action['actor']}: {action['reason']}")
    print("          payload:")
    print(json.dumps(record.get("payload"), indent=2, default=str))
    return 0


def _ordering_line(doc: dict[str, Any]) -> str:
    text = f"key {doc['key']} (on_dead_letter: {doc.get('policy')})"
    parked = doc.get("parked")
    if doc.get("order_broken_after"):
        text += "; its later events went on: order broken after it"
    if parked is None:
        return text + "; nothing of the key is parked now"
    who = "this dead letter" if parked["this_is_the_head"] else f"head {parked['head_id']}"
    return (
        f"{text}; parked behind {who} ({parked['head_state']}): "
        f"{parked['waiting_behind_head']} event(s) waiting"
    )
