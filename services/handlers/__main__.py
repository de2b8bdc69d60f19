"""``python -m services.handlers --service NAME [--port P] [--host H]``: serve one handler.

Wires settings to a :class:`HandlerService` and an aiohttp runner, then waits for
SIGTERM/SIGINT. Exit codes: 0 after a clean stop, 2 on a configuration error (unknown
service, bad settings, port in use, fault injection in production), 3 when the database
fails while starting (or NATS, for a handler that runs replay jobs).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from aiohttp import web
from pydantic import ValidationError

from shared.adapters.nats import connect_nats
from shared.adapters.postgres import CONNECTION_ERRORS, create_pool
from shared.contracts.lint import require_clean_topology
from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError, TransientError
from shared.runtime import loop
from shared.runtime.lifecycle import EXIT_CONFIG, EXIT_CONNECT, EXIT_OK, stop_on_signals
from shared.runtime.logs import configure_logging
from shared.telemetry import setup_tracing
from shared.waits import sleep_unless, within

from .app import make_app
from .contexts import module_g
from .service import build_service
from .settings import HandlerSettings
from .specs import SERVICES, service_spec

ROLE_PREFIX = "handler-"
#: Pool size: one connection per call in flight; beyond it calls wait (then 503).
POOL_SIZE = 20
#: Seconds SIGTERM allows in-flight calls to finish, below supervisord's stopwaitsecs.
SHUTDOWN_TIMEOUT = 8.0
#: Seconds a replay-job worker waits for NATS at start before it gives up (exit 3).
NATS_WAIT = 60.0
#: Longest pause between attempts to reach PostgreSQL at start.
RETRY_MAX = 5.0

log = logging.getLogger("ferry.handlers")


def listen_ports(settings: HandlerSettings, topology: Topology, service: str) -> list[int]:
    """``--port`` if given, else the ports of the handler URLs of durables targeting us."""
    if settings.port is not None:
        return [settings.port]
    ports = {
        urlsplit(durable.handler.url).port or 80
        for durable in topology.durables.values()
        if durable.target == service
    }
    if not ports:
        raise ConfigurationError(
            f"no durable of topology {topology.name!r} targets {service!r}: give --port"
        )
    return sorted(ports)


async def run(settings: HandlerSettings, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set, then finish in-flight calls and close."""
    if not settings.service:
        raise ConfigurationError("no service given: use --service NAME or FERRY_SERVICE")
    settings.check_fault_injection()
    spec = service_spec(settings.service)
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    context = topology.context(spec.name)
    ports = listen_ports(settings, topology, spec.name)
    pool = await _create_pool_retrying(settings.dsn(context.database), stop)
    if pool is None:
        return EXIT_OK
    try:
        service = build_service(
            spec, pool=pool, topology=topology, fault_injection=settings.handler_fault_injection
        )
        if service.fault_injection:
            log.warning(
                "FERRY_HANDLER_FAULT_INJECTION is on: payloads' _ferry_test directives are "
                "obeyed (a test setting; never in production)"
            )
        nc = await _replay_worker(settings, topology, spec.name)
        secrets = settings.verification_secrets()
        if not secrets:
            log.warning("FERRY_HANDLER_SECRETS is not set: requests are not authenticated")
        app = make_app(service=service, secrets=secrets, tolerance=settings.signature_tolerance)
        try:
            await _serve(app, settings.host, ports, stop)
        finally:
            module_g.serve_replay_jobs(None)
            if nc is not None:
                await nc.close()
    finally:
        await _close_pool(pool)
    return EXIT_OK


async def _replay_worker(settings: HandlerSettings, topology: Topology, service: str) -> Any:
    """With FERRY_HANDLER_REPLAY_JOBS on: the NATS connection replay jobs run on (module_g's
    route executes them with it); None when off."""
    if not settings.handler_replay_jobs:
        return None
    workers = replay_workers(topology)
    if service not in workers or service != module_g.SPEC.name:
        raise ConfigurationError(
            f"FERRY_HANDLER_REPLAY_JOBS is on, but {service!r} runs no replay jobs in topology "
            f"{topology.name!r} (their handler: {', '.join(workers) or 'none'})"
        )
    nc = await connect_nats(
        settings.nats_servers(),
        name=f"{ROLE_PREFIX}{service}",
        ping_interval=settings.nats_ping_interval,
        auth=settings.nats_auth(),
        give_up_after=NATS_WAIT,
    )
    module_g.serve_replay_jobs(
        module_g.ReplayWorker(settings, topology, nc, rate=settings.handler_replay_rate)
    )
    pace = settings.handler_replay_rate or "no limit"
    log.info("running replay jobs (%s replays/s at most)", pace)
    return nc


async def _serve(app: web.Application, host: str, ports: list[int], stop: asyncio.Event) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    try:
        for port in ports:
            await _start_site(runner, host, port)
        # Port 0 asks the OS for one; log the real ones so a caller can find us.
        bound = sorted({int(address[1]) for address in runner.addresses})
        log.info("serving on %s", ", ".join(f"http://{host}:{p}/handle" for p in bound))
        await stop.wait()
        log.info("stopping: finishing calls in flight")
    finally:
        await runner.cleanup()


async def _start_site(runner: web.AppRunner, host: str, port: int) -> None:
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


async def _create_pool_retrying(dsn: str, stop: asyncio.Event) -> asyncpg.Pool | None:
    """A pool, retrying while PostgreSQL is away; None if stopped before one was made."""
    delay = 0.2
    while not stop.is_set():
        try:
            return await create_pool(dsn, min_size=1, max_size=POOL_SIZE)
        except TransientError as exc:
            log.warning("postgres not reachable (%s); retrying in %.1fs", exc, delay)
        await sleep_unless(stop, delay)
        delay = min(delay * 2, RETRY_MAX)
    return None


async def _close_pool(pool: asyncpg.Pool) -> None:
    try:
        await within(SHUTDOWN_TIMEOUT, pool.close())
    except TimeoutError:
        pool.terminate()


async def _main(settings: HandlerSettings) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    tracing = setup_tracing(f"{ROLE_PREFIX}{settings.service or 'unknown'}", settings)
    loop.freeze()  # what tracing imported lives as long as the process too
    try:
        return await run(settings, stop)
    finally:
        tracing.shutdown()


def _parse_args(argv: list[str] | None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m services.handlers")
    parser.add_argument("--service", help=f"one of {', '.join(SERVICES)} (default: FERRY_SERVICE)")
    parser.add_argument("--port", type=int, help="port (default: the topology's handler URLs)")
    parser.add_argument("--host", help="interface to bind (default: FERRY_HOST or 127.0.0.1)")
    args = parser.parse_args(argv)
    return {name: value for name, value in vars(args).items() if value is not None}


def main(argv: list[str] | None = None) -> int:
    """Entry point; options win over ``FERRY_SERVICE``, ``FERRY_PORT``, ``FERRY_HOST``."""
    overrides = _parse_args(argv)
    try:
        settings = HandlerSettings(**overrides)
    except ValidationError as exc:
        configure_logging(f"{ROLE_PREFIX}{overrides.get('service', 'unknown')}")
        log.error("invalid settings: %s", exc)
        return EXIT_CONFIG
    configure_logging(f"{ROLE_PREFIX}{settings.service or 'unknown'}", settings.log_level)
    try:
        return loop.run(
            _main(settings), choice=settings.event_loop, gc_policy=settings.gc_threshold
        )
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG
    except CONNECTION_ERRORS as exc:
        log.error("database failed while starting: %s", exc)
        return EXIT_CONNECT
    except TransientError as exc:
        log.error("NATS not reachable while starting (replay jobs): %s", exc)
        return EXIT_CONNECT


if __name__ == "__main__":
    sys.exit(main())
