"""The one role lifecycle: signals, tracing, health, a bounded drain, exit codes.

Every role's ``__main__`` wires settings to adapters and a worker, then hands the rest
to :func:`run_role` (signals and tracing around ``run``, exceptions to exit codes) and
:func:`serve` (a health endpoint, the work until ``stop``, then the work in hand
finishes inside the drain deadline). ``services/dlq_router/__main__.py`` is the model; the
console and the handler services serve their own HTTP (``serve(health_server=False)``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.runtime import loop
from shared.runtime.connections import TopologyConnections, connect_topology
from shared.runtime.health import HealthServer
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import RoleMetrics
from shared.runtime.readiness import ReadinessCheck
from shared.runtime.settings import CommonSettings
from shared.telemetry import setup_tracing
from shared.waits import within

log = logging.getLogger("ferry.wiring")

#: Exit codes, named (dramatiq's habit): supervisord and Kubernetes show them.
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_CONNECT = 3
EXIT_DRAIN_TIMEOUT = 4


def exit_code_of(exc: AccessDenied | ConfigurationError | TransientError) -> int:
    """The exit code of a role or a ``ferry`` command ended by ``exc``: the one mapping.

    Refused credentials and an unreachable server are EXIT_CONNECT (the platform's
    restart policy retries them), a configuration error is EXIT_CONFIG (it does not heal
    by itself). A role lets no TransientError out (it reconnects forever); a command may.
    """
    if isinstance(exc, AccessDenied | TransientError):  # AccessDenied is a ConfigurationError
        return EXIT_CONNECT
    return EXIT_CONFIG


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (the drain then runs under its deadline)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve(
    *,
    settings: CommonSettings,
    work: Callable[[asyncio.Event], Awaitable[Any]],
    checks: dict[str, ReadinessCheck],
    stop: asyncio.Event,
    drain_deadline: float,
    metrics: RoleMetrics | None = None,
    health_server: bool = True,
) -> int:
    """Run ``work(inner_stop)`` with a health endpoint until ``stop``; the exit code.

    When ``stop`` is set (or the work ends by itself), ``inner_stop`` is set and the work
    has ``drain_deadline`` seconds to finish: past it, it is cancelled and the exit code is
    EXIT_DRAIN_TIMEOUT. An error the work raises goes to the caller (then :func:`run_role`
    makes it an exit code). ``health_server=False``: the role's own HTTP server answers
    ``/healthz``, ``/readyz`` and ``/metrics`` on its port (the console, the handlers),
    so FERRY_HEALTH_PORT opens none beside it and ``checks`` go unused.
    """
    health = HealthServer(
        host=settings.health_host, port=settings.health_port or 0, checks=checks, metrics=metrics
    )
    if health_server and settings.health_port:
        await health.start()
    try:
        inner_stop = asyncio.Event()
        task = asyncio.ensure_future(work(inner_stop))
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        inner_stop.set()
        code = EXIT_OK
        try:
            await within(drain_deadline, task)
        except TimeoutError:
            code = EXIT_DRAIN_TIMEOUT
    finally:
        await health.stop()
    return code


@dataclass
class TopologyWork:
    """What a whole-topology role hands :func:`serve_topology`: its work, its own readiness
    checks (beside the connections'), its drain deadline, and what it logs once stopped."""

    work: Callable[[asyncio.Event], Awaitable[Any]]
    checks: dict[str, ReadinessCheck]
    drain_deadline: float
    stopped: Callable[[], None]


async def serve_topology(
    settings: CommonSettings,
    role: str,
    stop: asyncio.Event,
    build: Callable[[TopologyConnections, RoleMetrics], TopologyWork],
) -> int:
    """Run a role that serves a whole topology (dlq-router, dlq-replayer): connect to it
    (:func:`~shared.runtime.connections.connect_topology`), ``build`` the role's work on
    the connections and the role's metrics, :func:`serve` it, then close the connections."""
    connected = await connect_topology(settings, role, stop)
    metrics = RoleMetrics(role, refresh_interval=settings.metrics_refresh_interval)
    served = build(connected, metrics)
    try:
        return await serve(
            settings=settings,
            work=served.work,
            checks={**connected.checks(), **served.checks},
            stop=stop,
            drain_deadline=served.drain_deadline,
            metrics=metrics,
        )
    finally:
        await connected.close()
        served.stopped()


def topology_role_main(
    *,
    role: str,
    settings_class: type[CommonSettings],
    run: Callable[[Any, asyncio.Event], Awaitable[int]],
    argv: list[str] | None,
) -> int:
    """Entry point of a role that serves a whole topology (dlq-router, dlq-replayer), run as
    ``python -m services.<role>`` (its dashes underscores).

    ``--topology`` overrides FERRY_TOPOLOGY; logging, signals and tracing are set up here;
    exit codes: 3 when NATS refuses our credentials, 2 on a configuration error.
    """
    parser = argparse.ArgumentParser(prog=f"python -m services.{role.replace('-', '_')}")
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
    refused credentials, and a server still unreachable when a role gives up waiting for it
    while starting (a TransientError let out), exit with EXIT_CONNECT, a configuration
    error with EXIT_CONFIG, each logged with what is wrong.
    """

    async def main() -> int:
        stop = asyncio.Event()
        stop_on_signals(stop)
        tracing = setup_tracing(role, settings)
        loop.freeze()  # what tracing imported lives as long as the process too
        try:
            return await run(settings, stop)
        finally:
            tracing.shutdown()

    try:
        return loop.run(main(), choice=settings.event_loop, gc_policy=settings.gc_threshold)
    except AccessDenied as exc:
        log.error("%s", exc)
        return exit_code_of(exc)
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        return exit_code_of(exc)
    except TransientError as exc:
        log.error("not reachable while starting: %s", exc)
        return exit_code_of(exc)
