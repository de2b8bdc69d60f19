"""Bounded waits that keep a cancellation: every wait with a timeout in Ferry goes here.

Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives in the loop turn in
which the awaited thing finishes: it returns the result, and the cancelled task carries
on as if nothing happened (3.12 rewrote ``wait_for`` on top of ``asyncio.timeout`` and
fixed it). A loop that waits "until stop, or for the interval" and is cancelled just as
its event fires then never ends: a partition owner cancelled as if killed went on
renewing its leases, and whoever awaited it waited forever (a CI run hung on exactly
that). ``asyncio.timeout`` cancels the waiting task itself instead of a wrapper, so an
outside cancellation is never mistaken for the timeout's, nor dropped.

Lint forbids ``asyncio.wait_for`` in Ferry's own code (ruff's banned-api, TID251).

The same care for a task stopped from outside: ``task.cancel()`` then ``await task``
inside ``suppress(CancelledError)`` also swallows the *caller's* cancellation, should it
arrive meanwhile; :func:`cancel_and_wait` keeps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def within(seconds: float | None, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, raising :class:`TimeoutError` after ``seconds`` (None: no
    limit). On the timeout the awaitable is cancelled, as ``asyncio.wait_for`` does."""
    async with asyncio.timeout(seconds):
        return await awaitable


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less when ``stop`` is set; whether ``stop`` is set."""
    if stop.is_set():
        return True
    if seconds > 0:
        try:
            async with asyncio.timeout(seconds):
                await stop.wait()
        except TimeoutError:
            pass
    return stop.is_set()


async def wait_any(*events: asyncio.Event, timeout: float | None) -> None:
    """Return when any of ``events`` is set or after ``timeout`` seconds (None: no limit)."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def cancel_and_wait(task: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Cancel ``task`` and wait (up to ``timeout`` seconds, None: no limit) until it has
    ended; whether it has. Its own cancellation is absorbed; an error it ended with is
    raised here; the caller's cancellation is never absorbed."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        return False
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error
    return True
