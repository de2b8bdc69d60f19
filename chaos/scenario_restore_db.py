"""The PostgreSQL side of the restore drill (:mod:`chaos.scenario_restore`): the wheel's
client programs (``pg_dump``, ``pg_restore``) and the reads of ids and of inbox duplicates.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import asyncpg

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
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return {r["id"] for r in await conn.fetch(query, *args)}
    finally:
        await conn.close()


async def duplicates(dsn: str, durable: str, ids: set[str]) -> dict[str, int]:
    """Duplicates the inbox of ``durable`` counted on each of ``ids`` (that it has)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT message_id::text AS id, duplicates FROM inbox_messages"
            " WHERE durable = $1 AND message_id = ANY($2::uuid[])",
            durable,
            sorted(ids),
        )
    finally:
        await conn.close()
    return {r["id"]: int(r["duplicates"] or 0) for r in rows}
