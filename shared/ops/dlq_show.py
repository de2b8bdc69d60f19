"""``ferry dlq show`` (see :mod:`shared.ops.dlq`): one dead letter in full, with its
trace id, operator actions and, for an ``ordering: key`` durable, its key's parked queue."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters import parking
from shared.adapters.postgres import connect
from shared.ops.dlq_find import public
from shared.runtime.settings import CommonSettings


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


async def show_dead_letter(
    settings: CommonSettings, durable: str, message_id: uuid.UUID
) -> dict[str, Any] | None:
    """One dead letter in full (``ferry dlq show``, the console): the row as JSON-friendly
    data with its trace id, operator actions and ordering; None when there is none."""
    topology = settings.load_topology()
    spec = topology.durable(durable)
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        query = store.Query(durables=[durable], message_ids=[message_id])
        rows = await store.find(conn, query)
        done = await store.actions(conn, durable, message_id)
        ordering = await _ordering(conn, durable, rows[0]) if rows else None
    finally:
        await conn.close()
    if not rows:
        return None
    row = public(rows[0])
    row["trace_id"] = _trace_id(row.get("traceparent"))
    row["actions"] = done
    row["ordering"] = ordering
    return row


async def _ordering(conn: Any, durable: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """An ``ordering: key`` dead letter's key, policy, and its key's parked queue now."""
    record = row.get("record")
    if isinstance(record, str):
        record = json.loads(record)
    found = record.get("ordering") if isinstance(record, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("key"), str):
        return None
    doc = dict(found)
    queue = await parking.keys(conn, durable, found["key"], 1)
    if queue:
        head = queue[0]
        doc["parked"] = {
            "events": head["events"],
            "head_id": str(head["head_id"]),
            "head_state": head["head_state"],
            "this_is_the_head": head["head_id"] == row["message_id"],
            "waiting_behind_head": head["events"] - 1,
        }
    else:
        doc["parked"] = None
    return doc


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


def _trace_id(traceparent: Any) -> str | None:
    parts = str(traceparent or "").split("-")
    return parts[1] if len(parts) == 4 else None
