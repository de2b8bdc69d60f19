"""``ferry dlq``: the operator's dead-letter commands (REQ-053, REQ-059, INFRA-005 §4.3).

    ferry dlq list     [FILTERS] [--limit N]            one line per dead letter
    ferry dlq show     DURABLE MESSAGE_ID               record, payload, history, actions
    ferry dlq replay   (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run] [--rate N]
    ferry dlq park     (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run]
    ferry dlq discard  (DURABLE MESSAGE_ID | FILTERS) --reason WHY [--dry-run]
    ferry dlq export   [FILTERS] [--output FILE]        JSON lines, one record each

FILTERS: --durable D, --reason-code R, --status S (each repeatable), --subject PATTERN
(NATS wildcards), --since/--until (RFC 3339 time or a duration ago such as 2h).
Every change is recorded in ``dead_letter_actions`` with who (--actor, default the OS
user@host), when and why. A filter that would change more than one entry needs --all.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters import parking
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.domain.durations import parse_duration
from shared.domain.errors import ConfigurationError
from shared.runtime.settings import CommonSettings

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]
STATUSES = ("dead", "held", "replaying", "replayed", "parked", "discarded")


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


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a message id (UUID)") from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _query(topology: Topology, args: argparse.Namespace) -> store.Query:
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


def _line(row: dict[str, Any]) -> str:
    at = row["dead_lettered_at"].strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{at}  {row['durable']:<24} {row['message_id']}  {row['status']:<9} "
        f"{row['reason_code']:<24} x{row['replay_attempts']}  {row['original_subject']}"
    )


def _public(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON-friendly data (what --json and export print)."""
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}


async def cmd_list(settings: CommonSettings, args: argparse.Namespace) -> int:
    """List dead letters matching the filters, oldest first."""
    rows = await _find(settings, _query(settings.load_topology(), args))
    if args.json:
        print(json.dumps([_public(r) for r in rows], indent=2, default=str))
    elif not rows:
        print("no dead letters match")
    else:
        print(f"{'dead-lettered at':<19}  {'durable':<24} {'message id':<36}  status    reason")
        for row in rows:
            print(_line(row))
        print(f"{len(rows)} dead letter(s)")
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
    row = _public(rows[0])
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


def _actor(args: argparse.Namespace) -> str:
    return str(args.actor or f"{getpass.getuser()}@{socket.gethostname()}")


async def _selected(settings: CommonSettings, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The entries a change command targets: one by key, or a filter (with --all)."""
    topology = settings.load_topology()
    if args.key:
        durable, message_id = args.key
        topology.durable(durable)
        query = store.Query(durables=[durable], message_ids=[_uuid(message_id)])
    else:
        query = _query(topology, args)
        if not (query.durables or query.reasons or query.statuses or query.subject
                or query.since or query.until):  # fmt: skip
            raise ConfigurationError(
                "name one dead letter (DURABLE MESSAGE_ID) or give at least one filter"
            )
    return await _find(settings, query)


def _check_count(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int | None:
    if not rows:
        print("no dead letters match", file=sys.stderr)
        return 1
    if len(rows) > 1 and not args.all and not args.dry_run:
        print(
            f"ferry: {len(rows)} dead letters match; add --all to change them all "
            "(or --dry-run to see them)",
            file=sys.stderr,
        )
        return 2
    return None


async def cmd_replay(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Replay one dead letter or every match of a filter, at most --rate per second."""
    rows = await _selected(settings, args)
    early = _check_count(args, rows)
    if early is not None:
        return early
    if args.dry_run:
        for row in rows:
            print("would replay " + _line(row))
        print(f"{len(rows)} would be replayed (dry run: nothing changed)")
        return 0
    topology = settings.load_topology()
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-dlq", auth=settings.nats_auth(), give_up_after=10
    )
    failures = 0
    try:
        for index, row in enumerate(rows):
            if index:
                await asyncio.sleep(1.0 / args.rate)
            failures += await _replay_one(settings, topology, nc, row, args)
    finally:
        await nc.close()
    print(f"{len(rows) - failures} replayed, {failures} refused")
    return 1 if failures else 0


async def replay_dead_letter(
    settings: CommonSettings,
    topology: Topology,
    nc: Any,
    row: dict[str, Any],
    *,
    actor: str,
    reason: str,
) -> store.Replayed:
    """Replay one dead letter as an operator (``ferry dlq replay``, the console), audited
    in ``dead_letter_actions``; :class:`store.NotReplayable` when it may not be."""
    durable = row["durable"]
    conn = await connect(settings.dsn(topology.context(topology.durable(durable).target).database))
    try:
        return await store.replay(
            conn,
            nc.jetstream(),
            durable=durable,
            message_id=row["message_id"],
            actor=actor,
            reason=reason,
            automatic=False,
            topology=topology,
        )
    finally:
        await conn.close()


async def _replay_one(
    settings: CommonSettings, topology: Topology, nc: Any, row: dict[str, Any], args: Any
) -> int:
    durable = row["durable"]
    try:
        done = await replay_dead_letter(
            settings, topology, nc, row, actor=_actor(args), reason=args.reason
        )
    except store.NotReplayable as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(
        f"replayed {durable} {row['message_id']} (replay {done.replay_attempt}) on {done.subject}"
    )
    return 0


async def set_dead_letter_status(
    settings: CommonSettings,
    topology: Topology,
    row: dict[str, Any],
    status: str,
    *,
    actor: str,
    reason: str,
) -> tuple[bool, str | None]:
    """Park or discard one dead letter (``ferry dlq park|discard``, the console), audited:
    (whether it changed, the ordering key released when a held head was discarded)."""
    durable = row["durable"]
    spec = topology.durable(durable)
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        done = await store.set_status(
            conn,
            durable=durable,
            message_id=row["message_id"],
            status=status,  # type: ignore[arg-type]
            actor=actor,
            reason=reason,
        )
        released = None
        if done and status == "discarded" and spec.ordering == "key":
            # Its key's later events wait behind it no longer.
            released = await parking.discard_held(
                conn, durable, row["message_id"], actor=actor, reason=reason
            )
    finally:
        await conn.close()
    return done, released


async def _set_status(settings: CommonSettings, args: argparse.Namespace, status: str) -> int:
    rows = await _selected(settings, args)
    early = _check_count(args, rows)
    if early is not None:
        return early
    verb = "park" if status == "parked" else "discard"
    if args.dry_run:
        for row in rows:
            print(f"would {verb} " + _line(row))
        print(f"{len(rows)} would be {status} (dry run: nothing changed)")
        return 0
    topology = settings.load_topology()
    refused = 0
    for row in rows:
        durable = row["durable"]
        done, released = await set_dead_letter_status(
            settings, topology, row, status, actor=_actor(args), reason=args.reason
        )
        if done:
            print(f"{status} {durable} {row['message_id']}")
            if released is not None:
                print(f"  released key {released}: its parked events go on")
        else:
            refused += 1
            print(f"refused: {durable} {row['message_id']} is {row['status']}", file=sys.stderr)
    return 1 if refused else 0


async def cmd_park(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Park: no automatic replay until an operator replays it."""
    return await _set_status(settings, args, "parked")


async def cmd_discard(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Discard: give up on it for good (the record stays, for the audit)."""
    return await _set_status(settings, args, "discarded")


async def cmd_export(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Matching dead letters as JSON lines (to --output or stdout)."""
    rows = await _find(settings, _query(settings.load_topology(), args))
    lines = [json.dumps(_public(r), default=str, sort_keys=True) for r in rows]
    if args.output:
        text = "".join(line + "\n" for line in lines)
        await asyncio.to_thread(Path(args.output).write_text, text, encoding="utf-8")
        print(f"exported {len(lines)} dead letter(s) to {args.output}", file=sys.stderr)
    else:
        for line in lines:
            print(line)
    return 0


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
    show.add_argument("message_id", type=_uuid, metavar="MESSAGE_ID")
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
    export = verbs.add_parser("export", help="dead letters as JSON lines")
    _filters(export)
    export.add_argument("--output", help="file to write (default: stdout)")
    export.set_defaults(func=cmd_export)
    for parser in (lst, show, replay, park, discard, export):
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
