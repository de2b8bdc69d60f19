"""``ferry``: the operator's commands.

    ferry migrate                 create and migrate every context database
    ferry provision [--check]     create/update streams and consumers; --check only reports
    ferry outbox-backlog CONTEXT  QRY-050: unpublished count and oldest occurred_at
    ferry outbox list|republish   outbox rows set aside by the publisher (shared/cli/outbox.py)
    ferry inbox-backlog DURABLE   QRY-051: unprocessed count and oldest received_at
    ferry purge [SCOPE]           delete rows past their retention (shared/cli/purge.py)
    ferry dlq ...                 dead letters: list, show, replay, park, discard, export
    ferry durable rewind          re-deliver part of a stream to one durable (shared/cli/rewind.py)
    ferry registry generate|check the handler registry from the manifests (shared/cli/registry.py)
    ferry asyncapi                the AsyncAPI 3.0 document of a topology (shared/cli/registry.py)
    ferry lint [--topology FILE]  the configuration lint every role runs at start
    ferry where MESSAGE_ID        every hop of one event (shared/cli/where.py)
    ferry nats-auth               the nats-server users and permissions of the topologies
    ferry db-roles [--check]      PostgreSQL logins and grants per role (shared/access/db_roles.py)
    ferry handler-check URL       does a handler keep the contract (shared/cli/handler_check.py)
    ferry handler-models CONTEXT  payload models for an SDK handler (shared/cli/handler_models.py)
    ferry durable throttle        a durable's rate limit, changed live (shared/cli/throttle.py)
    ferry durable pause|resume    stop and restart a durable's deliveries (shared/cli/pause.py)

All read FERRY_* settings (docs/reference/settings.md). ``--json`` prints machine-readable output.
Exit codes: 0 ok, 1 drift or refusal found, 2 configuration error, 3 cannot connect.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from shared.access.streams import is_clean, provision
from shared.adapters import inbox, outbox
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import connect, migrate_database, redact
from shared.cli import access as access_cli
from shared.cli import handler_check as handler_check_cli
from shared.cli import handler_models as handler_models_cli
from shared.cli import outbox as outbox_cli
from shared.cli import parked as parked_cli
from shared.cli import pause as pause_cli
from shared.cli import registry as registry_cli
from shared.cli import rewind as rewind_cli
from shared.cli import throttle as throttle_cli
from shared.cli.dlq import add_dlq_commands, check_key
from shared.cli.purge import add_purge_command
from shared.cli.where import add_where_command
from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.runtime import loop
from shared.runtime.lifecycle import exit_code_of
from shared.runtime.settings import CommonSettings

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]


def _emit(args: argparse.Namespace, doc: Any, human: str) -> None:
    print(json.dumps(doc, indent=2, default=str) if args.json else human)


async def cmd_migrate(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Create and migrate each database of the topology."""
    topology = settings.load_topology()
    report = {}
    for database in topology.databases():
        dsn = settings.dsn(database)
        report[database] = await migrate_database(dsn, create=not args.no_create)
    lines = [f"{db}: applied {', '.join(v) or 'nothing (up to date)'}" for db, v in report.items()]
    _emit(args, report, "\n".join(lines))
    return 0


async def cmd_provision(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Provision (or with --check, compare) streams and consumers."""
    topology = settings.load_topology()
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-provision", auth=settings.nats_auth(), give_up_after=10
    )
    try:
        changes = await provision(
            nc.jetstream(),
            topology,
            apply=not args.check,
            caps=settings.stream_caps(),
            repartition=args.repartition,
        )
    finally:
        await nc.close()
    doc = [vars(c) for c in changes]
    _emit(args, doc, "\n".join(c.describe() for c in changes))
    return 0 if is_clean(changes) else 1


async def cmd_outbox_backlog(settings: CommonSettings, args: argparse.Namespace) -> int:
    """QRY-050 for one context."""
    topology = settings.load_topology()
    dsn = settings.dsn(topology.context(args.context).database)
    conn = await connect(dsn)
    try:
        doc = {"context": args.context, **await outbox.backlog(conn)}
    finally:
        await conn.close()
    _emit(args, doc, _backlog_line(f"outbox {args.context}", doc))
    return 0


async def cmd_inbox_backlog(settings: CommonSettings, args: argparse.Namespace) -> int:
    """QRY-051 for one durable (or all of them)."""
    topology = settings.load_topology()
    names = [args.durable] if args.durable else sorted(topology.durables)
    docs = []
    for name in names:
        durable = topology.durable(name)
        conn = await connect(settings.dsn(topology.context(durable.target).database))
        try:
            docs.append({"durable": name, **await inbox.backlog(conn, name)})
        finally:
            await conn.close()
    _emit(
        args,
        docs if len(docs) != 1 else docs[0],
        "\n".join(_backlog_line(f"inbox {d['durable']}", d) for d in docs),
    )
    return 0


def _backlog_line(label: str, doc: dict[str, Any]) -> str:
    oldest = doc.get("oldest_at") or "-"
    extra = ", ".join(f"{k}={v}" for k, v in doc.items() if k not in ("count", "oldest_at"))
    return f"{label}: {doc['count']} pending, oldest {oldest} ({extra})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the commands)."""
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", dest="json_first", action="store_true", help="machine-readable output"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    migrate = sub.add_parser("migrate", help="create and migrate every context database")
    migrate.add_argument("--no-create", action="store_true", help="do not CREATE DATABASE")
    migrate.set_defaults(func=cmd_migrate)
    prov = sub.add_parser("provision", help="create/update streams and consumers")
    prov.add_argument("--check", action="store_true", help="report drift, change nothing")
    prov.add_argument(
        "--repartition",
        action="store_true",
        help="change an ordered durable's partition layout even while its consumers hold "
        "messages, and delete consumers of an old layout (docs: Ordering)",
    )
    prov.set_defaults(func=cmd_provision)
    out = sub.add_parser("outbox-backlog", help="QRY-050: outbox backlog of a context")
    out.add_argument("context")
    out.set_defaults(func=cmd_outbox_backlog)
    inb = sub.add_parser("inbox-backlog", help="QRY-051: inbox backlog per durable")
    inb.add_argument("durable", nargs="?", help="one durable (default: all)")
    inb.set_defaults(func=cmd_inbox_backlog)
    add_dlq_commands(sub)
    outbox_cli.add_commands(sub)
    parked_cli.add_commands(sub)
    rewind_cli.add_commands(sub)
    add_where_command(sub)
    add_purge_command(sub)
    for p in (migrate, prov, out, inb):
        p.add_argument("--json", action="store_true", help="machine-readable output")
    registry_cli.add_commands(sub)
    handler_check_cli.add_command(sub)
    handler_models_cli.add_commands(sub)
    access_cli.add_commands(sub)
    # Last: `ferry durable throttle` joins the `durable` group if another command made it.
    throttle_cli.add_commands(sub)
    pause_cli.add_commands(sub)
    return parser


def parse_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> argparse.Namespace:
    """Parse ``argv``; ``--json`` counts before the command (``ferry --json where``) or after.

    A subcommand's own ``--json`` default would overwrite the top-level flag in the
    namespace, so the top-level one has a name of its own and the two are joined here.
    """
    args = parser.parse_args(argv)
    args.json = bool(getattr(args, "json", False) or args.json_first)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ferry`` command."""
    parser = build_parser()
    args = parse_args(parser, argv)
    check_key(parser, args)
    settings = CommonSettings()
    func: Command = args.func
    try:
        return loop.run(
            func(settings, args), choice=settings.event_loop, gc_policy=settings.gc_threshold
        )
    except AccessDenied as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        return exit_code_of(exc)
    except ConfigurationError as exc:
        print(f"ferry: configuration error: {exc}", file=sys.stderr)
        return exit_code_of(exc)
    except TransientError as exc:
        print(f"ferry: {redact(str(exc))}", file=sys.stderr)
        return exit_code_of(exc)


if __name__ == "__main__":
    sys.exit(main())
