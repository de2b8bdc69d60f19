"""One statement on a database of the run, on a connection of its own (the run's reads and
writes outside any role: counts, drains, operator steps)."""

from __future__ import annotations

from typing import Any

import asyncpg


async def fetch(dsn: str, query: str, *args: Any, timeout: float = 10) -> list[asyncpg.Record]:
    """The rows of ``query``."""
    conn = await asyncpg.connect(dsn, timeout=timeout)
    try:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args)
        return rows
    finally:
        await conn.close()


async def fetchval(dsn: str, query: str, *args: Any, timeout: float = 10) -> Any:
    """The first value of ``query``'s first row."""
    conn = await asyncpg.connect(dsn, timeout=timeout)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def execute(dsn: str, query: str, *args: Any, timeout: float = 10) -> str:
    """Run ``query``; its status (``UPDATE 3``)."""
    conn = await asyncpg.connect(dsn, timeout=timeout)
    try:
        status: str = await conn.execute(query, *args)
        return status
    finally:
        await conn.close()
