"""``ferry where MESSAGE_ID``: every hop of one event, from the outbox to its handlers.

The journey is :func:`shared.ops.where.journey`'s (the console's event page shows the
same), printed as :mod:`shared.ops.where_render` renders it, or as JSON with ``--json``.

Exit codes: 0 found, 1 the id is nowhere in this topology.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shared.cli.dlq_read import parse_uuid
from shared.ops.where import journey
from shared.ops.where_render import render
from shared.runtime.settings import CommonSettings


def add_where_command(sub: Any) -> None:
    """Register ``ferry where`` on the ``ferry`` parser's subcommands."""
    where = sub.add_parser(
        "where", help="every hop of one event: outbox, stream, deliveries, inbox, dead letter"
    )
    where.add_argument("message_id", type=parse_uuid, help="the event id (= Nats-Msg-Id)")
    where.add_argument("--json", action="store_true", help="machine-readable output")
    where.set_defaults(func=cmd_where)


async def cmd_where(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Find the event everywhere; print the journey."""
    topology = settings.load_topology()
    doc = await journey(settings, topology, args.message_id)
    print(json.dumps(doc, indent=2, default=str) if args.json else render(doc))
    return 0 if doc["found"] else 1
