"""The changing ``ferry dlq`` commands (see :mod:`shared.cli.dlq`): ``replay``, ``park``
and ``discard`` of one dead letter or every match of a filter, and ``edit`` (edit-and-retry)
of one, each change audited in ``dead_letter_actions`` by :mod:`shared.ops.dlq`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters.nats import connect_nats
from shared.cli.audit_args import actor_of
from shared.cli.dlq_read import parse_uuid, query_from_args, row_line
from shared.contracts.topology import Topology
from shared.domain.dead_letter_edit import parse_edited_payload
from shared.domain.errors import ConfigurationError, MalformedInput
from shared.ops.dlq import find_dead_letters, replay_dead_letter, set_dead_letter_status
from shared.ops.dlq_edit import edit_dead_letter, plan_edit
from shared.runtime.settings import CommonSettings


async def _selected(settings: CommonSettings, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The entries a change command targets: one by key, or a filter (with --all)."""
    topology = settings.load_topology()
    if args.key:
        durable, message_id = args.key
        topology.durable(durable)
        query = store.Query(durables=[durable], message_ids=[parse_uuid(message_id)])
    else:
        query = query_from_args(topology, args)
        if not (query.durables or query.reasons or query.statuses or query.subject
                or query.since or query.until):  # fmt: skip
            raise ConfigurationError(
                "name one dead letter (DURABLE MESSAGE_ID) or give at least one filter"
            )
    return await find_dead_letters(settings, query)


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
            print("would replay " + row_line(row))
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


async def _replay_one(
    settings: CommonSettings, topology: Topology, nc: Any, row: dict[str, Any], args: Any
) -> int:
    durable = row["durable"]
    try:
        done = await replay_dead_letter(
            settings, topology, nc, row, actor=actor_of(args), reason=args.reason
        )
    except store.NotReplayable as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(
        f"replayed {durable} {row['message_id']} (replay {done.replay_attempt}) on {done.subject}"
    )
    return 0


async def _set_status(settings: CommonSettings, args: argparse.Namespace, status: str) -> int:
    rows = await _selected(settings, args)
    early = _check_count(args, rows)
    if early is not None:
        return early
    verb = "park" if status == "parked" else "discard"
    if args.dry_run:
        for row in rows:
            print(f"would {verb} " + row_line(row))
        print(f"{len(rows)} would be {status} (dry run: nothing changed)")
        return 0
    topology = settings.load_topology()
    refused = 0
    for row in rows:
        durable = row["durable"]
        done, released = await set_dead_letter_status(
            settings, topology, row, status, actor=actor_of(args), reason=args.reason
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


def _edited_payload(source: str) -> dict[str, Any]:
    """The new payload: a JSON object from the file ``source`` (``-``: standard input)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--payload-file {source}: cannot read it: {exc}") from None
    try:
        return parse_edited_payload(text)
    except MalformedInput as exc:
        raise ConfigurationError(f"--payload-file {source}: {exc}") from None


async def cmd_edit(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Edit one dead letter's payload and replay it (the edit audited with both versions)."""
    payload = _edited_payload(args.payload_file)
    topology = settings.load_topology()
    topology.durable(args.target_durable)
    query = store.Query(durables=[args.target_durable], message_ids=[args.message_id])
    rows = await find_dead_letters(settings, query)
    if not rows:
        print(f"no dead letter {args.target_durable} {args.message_id}", file=sys.stderr)
        return 1
    [row] = rows
    try:
        plan = plan_edit(topology, row, payload)
    except (store.EditRefused, store.NotReplayable) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    title = f"{row['durable']} {row['message_id']} ({row['event_type']}.v{row['event_version']})"
    if not args.json:
        print(f"edit of {title}:")
        print("\n".join(plan.diff))
        print("changed: " + ", ".join(plan.changed))
    if args.dry_run:
        if args.json:
            print(json.dumps({"dry_run": True, "changed": plan.changed, "diff": plan.diff}))
        else:
            print("the edit fits the schema (dry run: nothing changed, nothing replayed)")
        return 0
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-dlq", auth=settings.nats_auth(), give_up_after=10
    )
    try:
        done = await edit_dead_letter(
            settings, topology, nc, row, payload, actor=actor_of(args), reason=args.reason
        )
    except (store.EditRefused, store.NotReplayable) as exc:  # changed since it was read
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    if args.json:
        doc = {"dry_run": False, "changed": list(done.changed), "diff": plan.diff,
               "edit_id": done.edit_id, "replay_attempt": done.replay_attempt,
               "subject": done.subject}  # fmt: skip
        print(json.dumps(doc))
    else:
        print(
            f"replayed {title} with the edited payload (replay {done.replay_attempt}, "
            f"edit {done.edit_id}) on {done.subject}"
        )
    return 0
