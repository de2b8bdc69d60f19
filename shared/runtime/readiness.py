"""Readiness checks: what ``/readyz`` and the ``ferry_ready`` gauge ask before saying ready."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from shared.waits import within

#: A readiness check: a plain or an async callable returning True when ready.
ReadinessCheck = Callable[[], bool | Awaitable[bool]]
#: Longest wait for one async readiness check (a probe of PostgreSQL).
CHECK_TIMEOUT = 2.0


async def run_checks(checks: dict[str, ReadinessCheck]) -> dict[str, bool]:
    """Every check's verdict; an async one that errs or outlasts CHECK_TIMEOUT is False."""
    results: dict[str, bool] = {}
    # A snapshot: the checks are awaited, and the caller's dict may change meanwhile.
    for name, check in list(checks.items()):
        try:
            outcome = check()
            if inspect.isawaitable(outcome):
                outcome = await within(CHECK_TIMEOUT, outcome)
            results[name] = bool(outcome)
        except Exception:  # a failing probe means "not ready", never a 500
            results[name] = False
    return results


def postgres_probe(pool: Any) -> Callable[[], Awaitable[bool]]:
    """A readiness check that a pooled connection answers ``SELECT 1``."""

    async def probe() -> bool:
        async with pool.acquire(timeout=CHECK_TIMEOUT) as conn:
            return bool(await conn.fetchval("SELECT 1") == 1)

    return probe


def postgres_probes(pools: Any) -> Callable[[], Awaitable[bool]]:
    """Readiness of every pool in the mapping ``pools`` (dlq roles: one per database)."""

    async def probe() -> bool:
        for pool in list(pools.values()):  # the caller's mapping, probed across awaits
            if not await postgres_probe(pool)():
                return False
        return True

    return probe
