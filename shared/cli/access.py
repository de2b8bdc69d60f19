"""``ferry nats-auth`` and ``ferry db-roles``: least-privilege credentials from the topology.

    ferry nats-auth [--topology F ...] [--json]
        print nats-server's ``authorization`` block (passwords as $FERRY_NATS_PASSWORD_<USER>)
    ferry nats-auth --passwords-dir DIR [--generate] --output FILE
        the same block with the passwords of DIR inlined, written 0600 (never printed)
    ferry db-roles [--topology F ...] --passwords-dir DIR [--generate] | --no-passwords
        create every PostgreSQL login and grant it exactly its access (administrative DSN)
    ferry db-roles --logins-only ...
        only the logins (the owner among them), before the owner creates the databases
    ferry db-roles --show [--json]
        print each login's grants per database; changes nothing

Passwords live one per file in DIR (``nats-password-{role}``, ``pg-password-{role}``), the
shape of a mounted Kubernetes Secret; no command prints one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shared.access.db_apply import apply_roles
from shared.access.db_roles import describe
from shared.access.identities import DB_OWNER, SecretsDir, write_private
from shared.access.nats_auth import authorization_block, env_references, nats_users, passwords_from
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError
from shared.runtime.settings import CommonSettings


def _topologies(settings: CommonSettings, args: argparse.Namespace) -> list[Topology]:
    paths = args.topology or [settings.topology]
    return [load_topology(Path(p), registry=settings.registry) for p in paths]


async def cmd_nats_auth(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Print or write the nats-server authorization block of the topologies."""
    users = nats_users(_topologies(settings, args))
    if args.json:
        doc = {u: None if p is None else p.as_dict() for u, p in users.items()}
        print(json.dumps(doc, indent=2))
        return 0
    if args.passwords_dir is None:
        block = authorization_block(users, env_references)
    else:
        if args.output is None:
            raise ConfigurationError(
                "--passwords-dir writes passwords into the block: give --output FILE "
                "(it is written readable by its owner only, never printed)"
            )
        source = passwords_from(SecretsDir(args.passwords_dir), generate=args.generate)
        block = authorization_block(users, source)
    if args.output is None:
        print(block, end="")
    else:
        write_private(args.output, block)
        print(f"wrote {args.output} ({len(users)} users)")
    return 0


async def cmd_db_roles(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Create the PostgreSQL logins and grants of the topologies (or show them)."""
    topologies = _topologies(settings, args)
    if args.show:
        doc = describe(topologies)
        human = "\n".join(_grant_line(d) for d in doc)
        print(json.dumps(doc, indent=2) if args.json else human)
        return 0
    if args.no_passwords == (args.passwords_dir is not None):
        raise ConfigurationError("give exactly one of --passwords-dir DIR and --no-passwords")
    folder = None if args.passwords_dir is None else SecretsDir(args.passwords_dir)

    def password_of(name: str) -> str | None:
        if folder is None:
            return None
        path = folder.pg_password_file(name)
        return folder.ensure(path) if args.generate else folder.read(path)

    done = await apply_roles(
        topologies,
        settings.dsn,
        password_of,
        owner=not args.no_owner,
        logins_only=args.logins_only,
    )
    if args.logins_only:
        print("logins created; now migrate as the owner, then run `ferry db-roles` again")
        return 0
    if args.json:
        print(json.dumps(done, indent=2))
    else:
        for database, roles in done.items():
            print(f"{database}: {', '.join(roles)}")
    return 0


def _grant_line(doc: dict[str, Any]) -> str:
    parts = []
    for table, grant in doc["tables"].items():
        rows = "" if grant["rows"] == "all" else f" rows of {','.join(grant['rows']) or 'none'}"
        parts.append(f"{table}: {', '.join(grant['privileges'])}{rows}")
    if doc["create_tables"]:
        parts.append("CREATE in schema public (its own handler_* tables)")
    return f"{doc['role']} @ {doc['database']}: " + ("; ".join(parts) or "CONNECT only")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``nats-auth`` and ``db-roles`` on ``ferry``'s subcommands."""
    nats = sub.add_parser("nats-auth", help="nats-server users and permissions per role")
    nats.add_argument("--passwords-dir", type=Path, help="inline the passwords of this dir")
    nats.add_argument("--output", type=Path, help="write the block here (0600)")
    nats.set_defaults(func=cmd_nats_auth)
    db = sub.add_parser("db-roles", help="PostgreSQL logins and grants per role")
    db.add_argument("--passwords-dir", type=Path, help="pg-password-{role} files")
    db.add_argument("--no-passwords", action="store_true", help="leave passwords as they are")
    db.add_argument("--no-owner", action="store_true", help=f"do not create or change {DB_OWNER}")
    db.add_argument("--show", action="store_true", help="print the grants, change nothing")
    db.add_argument(
        "--logins-only", action="store_true", help="create the logins only (before migrating)"
    )
    db.set_defaults(func=cmd_db_roles)
    for parser in (nats, db):
        parser.add_argument(
            "--topology", action="append", help="topology file (repeatable; FERRY_TOPOLOGY)"
        )
        parser.add_argument(
            "--generate", action="store_true", help="create missing passwords (random)"
        )
        parser.add_argument("--json", action="store_true", help="machine-readable output")
