"""The event loop every Ferry process runs on: uvloop where it is installed, else asyncio's.

Each role spends most of its CPU in the event loop's own machinery — sockets, transports,
callbacks, timers — around nats-py, asyncpg and aiohttp. uvloop (libuv underneath, from
the authors of asyncpg) does that part several times cheaper than the standard loop, with
the same API; the benchmark measures both (``bench/RESULTS.md``).

``FERRY_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop if importable, asyncio
otherwise, e.g. on Windows), ``uvloop`` (refused with a clear error where it is missing)
or ``asyncio``. The benchmark's baselines and bare-bones pipeline read the same variable,
so each ratio compares processes on the same kind of loop.

The same function sets the process's garbage-collector policy (:func:`tune_gc`). After
its imports a process holds about 80,000 objects (modules, classes, functions) that live
as long as it does, and a full pass of Python's cyclic collector over them took about
65 ms, a pause every message in flight waited out, and under load a role made one every
few seconds. So every process freezes them out of collection (``gc.freeze``) and does it
again once it is set up (:func:`freeze`, after tracing's lazy imports). The young
generation's threshold is ``FERRY_GC_THRESHOLD`` net allocations of container objects,
10,000 by default against Python's 700: in the example handler under load, collections
took 8-11 % of its CPU at 700 and 1.5 % at 10,000. Reference counting still frees at
once everything not in a cycle; the threshold only bounds how much cyclic garbage waits.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shared.domain.errors import ConfigurationError

T = TypeVar("T")

#: The variable that chooses the loop, and its values.
LOOP_VARIABLE = "FERRY_EVENT_LOOP"
LOOP_CHOICES = ("auto", "uvloop", "asyncio")
#: The variable that sets the young-generation threshold, its default and bounds.
GC_VARIABLE = "FERRY_GC_THRESHOLD"
DEFAULT_GC_THRESHOLD = 10_000
GC_THRESHOLD_RANGE = (100, 1_000_000)
#: Whether :func:`tune_gc` has frozen this process's start-up yet (it does so once).
_started = {"frozen": False}


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


def gc_threshold(value: int | str | None = None) -> int:
    """The young-generation threshold: ``value``, else ``FERRY_GC_THRESHOLD``, else
    :data:`DEFAULT_GC_THRESHOLD`. Anything but a whole number within
    :data:`GC_THRESHOLD_RANGE` is a :class:`ConfigurationError` naming the variable."""
    raw = os.environ.get(GC_VARIABLE) if value is None else value
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return DEFAULT_GC_THRESHOLD
    low, high = GC_THRESHOLD_RANGE
    try:
        number = int(raw)
    except ValueError:
        number = None
    if number is None or not low <= number <= high:
        raise ConfigurationError(
            f"{GC_VARIABLE}={raw!r} is not a whole number from {low:,} to {high:,}"
            f" (Python's own is 700; Ferry's default {DEFAULT_GC_THRESHOLD:,})"
        )
    return number


def freeze() -> None:
    """Collect what start-up left behind, then move every object the process holds into
    the collector's permanent generation, which no pass walks. Cheap after the first
    call: a collection walks only what is not frozen."""
    gc.collect()
    gc.freeze()


def tune_gc(threshold: int) -> None:
    """:func:`freeze` (the first time in a process: a process that runs several loops,
    like a test session, does not freeze each one's leftovers) and set the
    young-generation ``threshold``; the older generations keep Python's thresholds."""
    if not _started["frozen"]:
        freeze()
        _started["frozen"] = True
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(threshold, middle, oldest)


def run(
    main: Coroutine[Any, Any, T], *, choice: str | None = None, gc_policy: int | None = None
) -> T:
    """``asyncio.run(main)`` on the chosen loop, with the garbage-collector policy of
    :func:`tune_gc` at ``gc_policy`` (default :func:`gc_threshold` of the environment)."""
    try:
        factory = loop_factory(choice)
        threshold = gc_threshold(gc_policy)
    except ConfigurationError:
        main.close()  # never awaited: say so to nobody
        raise
    tune_gc(threshold)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
