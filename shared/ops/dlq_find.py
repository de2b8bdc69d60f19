"""Finding dead letters for ``ferry dlq`` (see :mod:`shared.ops.dlq`): the filters as a
query, the search across every database of the topology, a row as one line or as
JSON-friendly data, and the read-only commands ``list`` and ``export``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.ops.audit_args import uuid_argument
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


def _by_database(topology: Topology, durables: list[str]) -> dict[str, list[str]]:
    """Durables (all, or those asked for) grouped by the database holding their inbox."""
    grouped: dict[str, list[str]] = {}
    for name in durables or sorted(topology.durables):
        database = topology.context(topology.durable(name).target).database
        grouped.setdefault(database, []).append(name)
    return grouped


async def find_dead_letters(settings: CommonSettings, query: store.Query) -> list[dict[str, Any]]:
    """Dead letters matching ``query`` in every database of the topology, oldest first
    (``ferry dlq list``, the console)."""
    topology = settings.load_topology()
    found: list[dict[str, Any]] = []
    for database, durables in _by_database(topology, query.durables).items():
        conn = await connect(settings.dsn(database))
        try:
            scoped = store.Query(**{**vars(query), "durables": durables})
            found.extend(await store.find(conn, scoped))
        finally:
            await conn.close()
    found.sort(key=lambda r: (r["dead_lettered_at"], r["durable"], str(r["message_id"])))
    return found[: query.limit] if query.limit else found


_find = find_dead_letters


def row_line(row: dict[str, Any]) -> str:
    at = row["dead_lettered_at"].strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{at}  {row['durable']:<24} {row['message_id']}  {row['status']:<9} "
        f"{row['reason_code']:<24} x{row['replay_attempts']}  {row['original_subject']}"
    )


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON-friendly data (what --json and export print)."""
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}


async def cmd_list(settings: CommonSettings, args: argparse.Namespace) -> int:
    """List dead letters matching the filters, oldest first."""
    rows = await _find(settings, query_from_args(settings.load_topology(), args))
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
    rows = await _find(settings, query_from_args(settings.load_topology(), args))
    lines = [json.dumps(public(r), default=str, sort_keys=True) for r in rows]
    if args.output:
        text = "".join(line + "\n" for line in lines)
        await asyncio.to_thread(Path(args.output).write_text, text, encoding="utf-8")
        print(f"exported {len(lines)} dead letter(s) to {args.output}", file=sys.stderr)
    else:
        for line in lines:
            print(line)
    return 0
