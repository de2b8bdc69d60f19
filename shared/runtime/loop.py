"""The event loop every Ferry process runs on: uvloop where it is installed, else asyncio's.

Each role spends most of its CPU in the event loop's own machinery — sockets, transports,
callbacks, timers — around nats-py, asyncpg and aiohttp. uvloop (libuv underneath, from
the authors of asyncpg) does that part several times cheaper than the standard loop, with
the same API; the benchmark measures both (``bench/RESULTS.md``).

``FERRY_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop if importable, asyncio
otherwise, e.g. on Windows), ``uvloop`` (refused with a clear error where it is missing)
or ``asyncio``. The benchmark's baselines and bare-bones pipeline read the same variable,
so each ratio compares processes on the same kind of loop.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shared.domain.errors import ConfigurationError

T = TypeVar("T")

#: The variable that chooses the loop, and its values.
LOOP_VARIABLE = "FERRY_EVENT_LOOP"
LOOP_CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the chosen loop (None: asyncio's default).

    ``choice`` defaults to ``FERRY_EVENT_LOOP`` (``auto`` when unset). Anything else than
    :data:`LOOP_CHOICES`, or ``uvloop`` where it cannot be imported, is a
    :class:`ConfigurationError` naming the variable and the value.
    """
    raw = os.environ.get(LOOP_VARIABLE, "auto") if choice is None else choice
    value = raw.strip().lower() or "auto"
    if value not in LOOP_CHOICES:
        raise ConfigurationError(f"{LOOP_VARIABLE}={raw!r} is not one of {', '.join(LOOP_CHOICES)}")
    if value == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if value == "uvloop":
            raise ConfigurationError(
                f"{LOOP_VARIABLE}=uvloop but uvloop cannot be imported ({exc}); install it "
                "or choose asyncio"
            ) from exc
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(choice: str | None = None) -> str:
    """``uvloop`` or ``asyncio``: the loop :func:`run` would run on."""
    return "asyncio" if loop_factory(choice) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], *, choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop (see the module's docstring)."""
    try:
        factory = loop_factory(choice)
    except ConfigurationError:
        main.close()  # never awaited: say so to nobody
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
