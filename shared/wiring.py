"""Wiring shared by the roles that serve a whole topology (dlq-router, dlq-replayer).

Each opens one pool per database that holds a durable's inbox, one NATS connection, a
health endpoint whose readiness names what is missing, and runs its worker until a
signal, then lets the work in hand finish inside the drain deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from shared.adapters.nats import connect_nats
from shared.adapters.postgres import create_pool_when_up
from shared.domain.errors import AccessDenied, ConfigurationError
from shared.metrics import RoleMetrics
from shared.runtime import (
    EXIT_CONFIG,
    EXIT_CONNECT,
    EXIT_DRAIN_TIMEOUT,
    EXIT_OK,
    HealthServer,
    ReadinessCheck,
    configure_logging,
    stop_on_signals,
)
from shared.settings import CommonSettings
from shared.telemetry import setup_tracing
from shared.topology import Topology

log = logging.getLogger("ferry.wiring")


async def target_pools(
    settings: CommonSettings, topology: Topology, stop: asyncio.Event, *, max_size: int = 4
) -> dict[str, asyncpg.Pool]:
    """A pool per database holding some durable's inbox, keyed by database name."""
    names = sorted({topology.context(d.target).database for d in topology.durables.values()})
    pools: dict[str, asyncpg.Pool] = {}
    for name in names:
        pools[name] = await create_pool_when_up(settings.dsn(name), max_size=max_size, stop=stop)
    return pools


class Connected:
    """A NATS connection whose up/down state a readiness check can read."""

    def __init__(self) -> None:
        self.up = False
        self.nc: NATS | None = None

    async def open(self, settings: CommonSettings, name: str) -> NATS:
        """Connect (reconnecting forever) and remember the connection."""
        self.nc = await connect_nats(
            settings.nats_servers(),
            name=name,
            ping_interval=settings.nats_ping_interval,
            auth=settings.nats_auth(),
            on_state=self._state,
        )
        return self.nc

    def _state(self, up: bool) -> None:
        self.up = up


async def serve(
    *,
    settings: CommonSettings,
    work: Callable[[asyncio.Event], Awaitable[Any]],
    checks: dict[str, ReadinessCheck],
    stop: asyncio.Event,
    drain_deadline: float,
    metrics: RoleMetrics | None = None,
) -> int:
    """Run ``work(inner_stop)`` with a health endpoint until ``stop``; the exit code."""
    health = HealthServer(
        host=settings.health_host, port=settings.health_port or 0, checks=checks, metrics=metrics
    )
    if settings.health_port:
        await health.start()
    inner_stop = asyncio.Event()
    task = asyncio.ensure_future(work(inner_stop))
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    inner_stop.set()
    code = EXIT_OK
    try:
        await asyncio.wait_for(task, timeout=drain_deadline)
    except TimeoutError:
        code = EXIT_DRAIN_TIMEOUT
    await health.stop()
    return code


async def close_all(nc: NATS | None, pools: dict[str, asyncpg.Pool]) -> None:
    """Close the connection and every pool, whatever state they are in."""
    if nc is not None:
        await nc.close()
    for pool in pools.values():
        await pool.close()


def topology_role_main(
    *,
    role: str,
    prog: str,
    settings_class: type[CommonSettings],
    run: Callable[[Any, asyncio.Event], Awaitable[int]],
    argv: list[str] | None,
) -> int:
    """Entry point of a role that serves a whole topology (dlq-router, dlq-replayer).

    ``--topology`` overrides FERRY_TOPOLOGY; logging, signals and tracing are set up here;
    exit codes: 3 when NATS refuses our credentials, 2 on a configuration error.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    args = parser.parse_args(argv)
    settings = settings_class(**({"topology": args.topology} if args.topology else {}))
    configure_logging(role, settings.log_level)

    return run_role(role, settings, run)


def run_role(
    role: str, settings: CommonSettings, run: Callable[[Any, asyncio.Event], Awaitable[int]]
) -> int:
    """Run one role's ``run(settings, stop)`` to its exit code.

    SIGTERM/SIGINT set ``stop``; tracing is set up around the run and flushed after it;
    refused credentials exit with EXIT_CONNECT, a configuration error with EXIT_CONFIG,
    each logged with what is wrong.
    """

    async def main() -> int:
        stop = asyncio.Event()
        stop_on_signals(stop)
        tracing = setup_tracing(role, settings)
        try:
            return await run(settings, stop)
        finally:
            tracing.shutdown()

    try:
        return asyncio.run(main())
    except AccessDenied as exc:
        log.error("%s", exc)
        return EXIT_CONNECT
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
