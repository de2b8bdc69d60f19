"""Waiting on asyncio events with a timeout: the publisher's workers and its watch."""

from __future__ import annotations

import asyncio


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set."""
    await wait_any(stop, timeout=seconds)


async def wait_any(*events: asyncio.Event, timeout: float | None) -> None:
    """Return when any of ``events`` is set or after ``timeout`` seconds (None: no limit)."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
