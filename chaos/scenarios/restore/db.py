"""The PostgreSQL side of the restore drill (:mod:`chaos.scenarios.restore.play`): the wheel's
client programs (``pg_dump``, ``pg_restore``) and the reads of ids and of inbox duplicates.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

from chaos.engine import db
from devstack.postgres import install_dir


async def pg_tool(name: str, *args: str) -> None:
    """Run one of the wheel's PostgreSQL client programs; raise with its stderr if it fails."""
    argv = [str(install_dir() / "bin" / name), *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr.strip()[-500:]}")


async def fetch_ids(dsn: str, query: str, *args: Any) -> set[str]:
    """The ``id`` column of ``query``'s rows."""
    return {r["id"] for r in await db.fetch(dsn, query, *args)}


async def duplicates(dsn: str, durable: str, ids: set[str]) -> dict[str, int]:
    """Duplicates the inbox of ``durable`` counted on each of ``ids`` (that it has)."""
    rows = await db.fetch(
        dsn,
        "SELECT message_id::text AS id, duplicates FROM inbox_messages"
        " WHERE durable = $1 AND message_id = ANY($2::uuid[])",
        durable,
        sorted(ids),
    )
    return {r["id"]: int(r["duplicates"] or 0) for r in rows}
