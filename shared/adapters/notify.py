"""LISTEN for a channel on a dedicated connection, reconnecting forever.

NOTIFY is a hint, not a queue: a notification sent while the listener was away is
lost, so every (re)connection fires the callback once to make the caller look.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from shared.adapters.postgres import DATABASE_ERRORS, connect
from shared.domain.errors import TransientError
from shared.waits import sleep_unless

log = logging.getLogger("ferry.notify")

#: How often the listener checks its connection is still alive.
LIVENESS_INTERVAL_SECONDS = 5.0


async def listen(
    dsn: str, channel: str, on_notify: Callable[[], None], stop: asyncio.Event
) -> None:
    """Call ``on_notify`` for each NOTIFY on ``channel`` until ``stop`` is set."""
    delay = 0.2
    while not stop.is_set():
        try:
            conn = await connect(dsn)
        except TransientError as exc:
            log.warning("listener cannot connect (%s); retrying in %.1fs", exc, delay)
            await sleep_unless(stop, delay)
            delay = min(delay * 2, 5.0)
            continue
        delay = 0.2
        try:
            await conn.add_listener(channel, lambda *_: on_notify())
            on_notify()
            await _watch(conn, stop)
        except DATABASE_ERRORS as exc:
            log.warning("listener lost its connection: %s", exc)
        finally:
            conn.terminate()


async def _watch(conn: asyncpg.Connection, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await sleep_unless(stop, LIVENESS_INTERVAL_SECONDS)
        if not stop.is_set():
            await conn.execute("SELECT 1", timeout=LIVENESS_INTERVAL_SECONDS)
