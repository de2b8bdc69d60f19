"""Retention: ``ferry purge`` deletes what the topology says need not be kept.

Per context, published outbox rows older than ``outbox_retention``; per durable, inbox
rows processed longer ago than its target context's ``inbox_retention``. Nothing
unfinished is ever deleted: an unpublished outbox row (pending or failing), an inbox row
still in process or retrying, a dead-lettered inbox row (its dead letter's lifecycle
governs it). Deletion goes in batches of ``batch`` rows, one statement each in its own
transaction, so a large purge never holds many row locks for long nor blocks the roles;
two purges can run at once (rows locked by one are skipped by the other).

The cut-off is taken once, from the database's clock, at the start of each table's
purge. Run it with a login that may DELETE from those tables (the schema owner, as for
``ferry migrate``): the roles' own logins may not, by design (``ferry db-roles``).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from shared.adapters import inbox, outbox
from shared.adapters.postgres import connect
from shared.domain.errors import ConfigurationError
from shared.settings import CommonSettings

#: Rows per DELETE statement.
DEFAULT_BATCH = 5000


@dataclass
class Purged:
    """What one table's purge found and did."""

    table: str
    scope: str
    database: str
    retention_seconds: float
    before: datetime
    purged: int

    def line(self, dry_run: bool) -> str:
        verb = "would purge" if dry_run else "purged"
        return (
            f"{self.table} {self.scope} ({self.database}): {verb} {self.purged:,} rows "
            f"older than {self.before.isoformat()} (retention {_days(self.retention_seconds)})"
        )


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds:g}s"


async def purge(
    settings: CommonSettings, *, batch: int = DEFAULT_BATCH, dry_run: bool = False,
    only: str | None = None,
) -> list[Purged]:  # fmt: skip
    """Purge every context's outbox and every durable's inbox (or only the context or
    durable named ``only``); with ``dry_run``, count instead of deleting."""
    topology = settings.load_topology()
    if only is not None and only not in topology.contexts and only not in topology.durables:
        raise ConfigurationError(
            f"{only!r} is neither a context nor a durable of topology {topology.name}"
        )
    report: list[Purged] = []
    for name, ctx in topology.contexts.items():
        if only not in (None, name) or ctx.stream is None:
            continue  # a context without a stream publishes nothing: it has no outbox rows
        conn = await connect(settings.dsn(ctx.database))
        try:
            before = await _cutoff(conn, ctx.outbox_retention)
            if dry_run:
                count = await outbox.purgeable(conn, before)
            else:
                count = await _drain(partial(outbox.purge_batch, conn, before, batch))
        finally:
            await conn.close()
        report.append(Purged("outbox", name, ctx.database, ctx.outbox_retention, before, count))
    for name, durable in topology.durables.items():
        if only not in (None, name, durable.target):
            continue
        target = topology.context(durable.target)
        conn = await connect(settings.dsn(target.database))
        try:
            before = await _cutoff(conn, target.inbox_retention)
            if dry_run:
                count = await inbox.purgeable(conn, name, before)
            else:
                count = await _drain(partial(inbox.purge_batch, conn, name, before, batch))
        finally:
            await conn.close()
        report.append(
            Purged("inbox", name, target.database, target.inbox_retention, before, count)
        )
    return report


async def _cutoff(conn: Any, retention: float) -> datetime:
    now: datetime = await conn.fetchval("SELECT now()")
    return now - timedelta(seconds=retention)


async def _drain(step: Callable[[], Awaitable[int]]) -> int:
    total = 0
    while True:
        deleted = await step()
        total += deleted
        if deleted == 0:
            return total


async def cmd_purge(settings: CommonSettings, args: argparse.Namespace) -> int:
    """``ferry purge``: print what was (or would be) purged, per table and scope."""
    if args.batch < 1:
        raise SystemExit("ferry purge: --batch must be at least 1")
    report = await purge(settings, batch=args.batch, dry_run=args.dry_run, only=args.scope)
    if args.json:
        import json

        doc = {"dry_run": args.dry_run, "tables": [asdict(p) for p in report]}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print("\n".join(p.line(args.dry_run) for p in report) or "nothing to purge")
    return 0


def add_purge_command(sub: Any) -> None:
    """Register ``ferry purge`` on the CLI's subparsers."""
    cmd = sub.add_parser(
        "purge",
        help="delete published outbox rows and processed inbox rows past their retention",
    )
    cmd.add_argument("scope", nargs="?", help="one context or durable (default: all)")
    cmd.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    cmd.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows per statement")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=cmd_purge)
