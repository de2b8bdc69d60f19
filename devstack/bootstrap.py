"""``python -m devstack.bootstrap [--secrets DIR] TOPOLOGY...``: logins, migrations, streams.

The stack's one-shot program: it waits for PostgreSQL and NATS (they start beside
it), then does what an operator does for each topology file:

1. ``ferry db-roles --logins-only``: every role's PostgreSQL login and the owner (with
   ``--secrets``, the stack's secrets directory holding their passwords);
2. ``ferry migrate`` as the owner (``ferry_owner`` creates the databases and owns the
   tables), or as the admin DSN without ``--secrets``;
3. ``ferry db-roles``: each login gets exactly its access;
4. ``ferry provision`` as the NATS admin.

Exit 0 when all is done and clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from devstack.credentials import login_dsn
from shared.access.db_apply import apply_roles
from shared.access.identities import DB_OWNER, SecretsDir
from shared.access.streams import is_clean, provision
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import CONNECTION_ERRORS, migrate_database
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.errors import TransientError
from shared.runtime.settings import CommonSettings

#: How long the servers may take to come up before bootstrap gives up.
WAIT_SECONDS = 60.0
T = TypeVar("T")
#: What a server that is still starting raises.
_NOT_UP_YET: tuple[type[BaseException], ...] = (TransientError, *CONNECTION_ERRORS)


async def _when_up(step: Callable[[], Awaitable[T]]) -> T:
    """Run ``step``, again while PostgreSQL is not accepting connections yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while True:
        try:
            return await step()
        except _NOT_UP_YET:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def prepare_databases(
    settings: CommonSettings, topologies: list[Topology], secrets: SecretsDir | None
) -> None:
    """Logins, then migrations as the owner, then grants (see the module doc)."""

    def password_of(name: str) -> str:
        assert secrets is not None
        return secrets.read(secrets.pg_password_file(name))

    if secrets is not None:
        await _when_up(lambda: apply_roles(topologies, settings.dsn, password_of, logins_only=True))
    for topology in topologies:
        for database in topology.databases():
            admin = settings.dsn(database)
            dsn = admin if secrets is None else login_dsn(admin, DB_OWNER, secrets)
            applied = await _when_up(partial(migrate_database, dsn))
            print(f"{topology.name}: database {database}: applied {applied or 'nothing'}")
    if secrets is not None:
        done = await apply_roles(topologies, settings.dsn, password_of)
        for database, roles in done.items():
            print(f"database {database}: granted {', '.join(roles)}")


async def bootstrap(paths: list[Path], secrets: Path | None = None) -> bool:
    """Prepare the databases and provision each topology; True when everything is clean."""
    settings = CommonSettings()
    topologies = [load_topology(path) for path in paths]
    folder = None if secrets is None else SecretsDir(secrets)
    await prepare_databases(settings, topologies, folder)
    nc = await connect_nats(
        settings.nats_servers(),
        name="ferry-bootstrap",
        auth=settings.nats_auth(),
        give_up_after=WAIT_SECONDS,
    )
    clean = True
    try:
        for topology in topologies:
            changes = await provision(nc.jetstream(), topology, caps=settings.stream_caps())
            for change in changes:
                print(f"{topology.name}: {change.describe()}")
            clean = clean and is_clean(changes)
    finally:
        await nc.close()
    return clean


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m devstack.bootstrap")
    parser.add_argument("--secrets", type=Path, help="the stack's secrets dir (role logins)")
    parser.add_argument("topologies", nargs="+", type=Path, metavar="TOPOLOGY.yaml")
    args = parser.parse_args(argv)
    return 0 if asyncio.run(bootstrap(args.topologies, args.secrets)) else 1


if __name__ == "__main__":
    sys.exit(main())
