"""``python -m devstack.bootstrap TOPOLOGY...``: migrate every database, provision every stream.

The stack's one-shot program: it waits for PostgreSQL and NATS (they start beside
it), then does what an operator does with ``ferry migrate`` and ``ferry provision``
for each topology file. Exit 0 when all is done and clean, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from shared.adapters.nats import connect_nats
from shared.adapters.postgres import migrate_database
from shared.domain.errors import TransientError
from shared.provision import is_clean, provision
from shared.settings import CommonSettings
from shared.topology import load_topology

#: How long the servers may take to come up before bootstrap gives up.
WAIT_SECONDS = 60.0


async def _migrate_when_up(dsn: str) -> list[str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while True:
        try:
            return await migrate_database(dsn)
        except TransientError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def bootstrap(paths: list[Path]) -> bool:
    """Migrate and provision each topology; True when everything is clean."""
    settings = CommonSettings()
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-bootstrap", give_up_after=WAIT_SECONDS
    )
    clean = True
    try:
        for path in paths:
            topology = load_topology(path)
            for database in topology.databases():
                applied = await _migrate_when_up(settings.dsn(database))
                print(f"{topology.name}: database {database}: applied {applied or 'nothing'}")
            changes = await provision(nc.jetstream(), topology, caps=settings.stream_caps())
            for change in changes:
                print(f"{topology.name}: {change.describe()}")
            clean = clean and is_clean(changes)
    finally:
        await nc.close()
    return clean


def main() -> int:
    """Entry point."""
    paths = [Path(arg) for arg in sys.argv[1:]]
    if not paths:
        print("usage: python -m devstack.bootstrap TOPOLOGY.yaml...", file=sys.stderr)
        return 2
    return 0 if asyncio.run(bootstrap(paths)) else 1


if __name__ == "__main__":
    sys.exit(main())
