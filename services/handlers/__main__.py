"""``python -m services.handlers --service NAME [--port P] [--host H]``: serve one handler.

Wires settings to a :class:`HandlerService` and an aiohttp runner, on the one role
lifecycle (:mod:`shared.runtime.lifecycle`): SIGTERM/SIGINT start the drain, calls in
flight finish within FERRY_DRAIN_DEADLINE (past it: exit 4). Exit codes: 0 after a clean
stop, 2 on a configuration error (unknown service, bad settings, port in use, fault
injection in production), 3 when the database fails while starting (or NATS, for a handler
that runs replay jobs: FERRY_HANDLER_REPLAY_JOBS hosts :mod:`shared.ops.replay_jobs`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import ValidationError

from shared.adapters.nats import connect_nats
from shared.adapters.postgres import CONNECTION_ERRORS, Pool, create_pool
from shared.contracts.lint import require_clean_topology
from shared.contracts.replay_jobs import REPLAY_JOB_EVENT, REPLAY_JOB_VERSION, replay_workers
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError, TransientError
from shared.ops.replay_jobs import ReplayJobWorker, replay_job_route
from shared.runtime.lifecycle import EXIT_CONFIG, run_role, serve
from shared.runtime.logs import configure_logging
from shared.runtime.tls import Reloading, server_context
from shared.waits import cancel_and_wait, sleep_unless, within

from .app import make_app
from .service import HandlerService, RouteKey, build_service
from .settings import HandlerSettings
from .specs import SERVICES, service_spec

ROLE_PREFIX = "handler-"
#: Pool size: one connection per call in flight; beyond it calls wait (then 503).
POOL_SIZE = 20
#: The replay API's job event: its route is the platform's (:mod:`shared.ops.replay_jobs`).
REPLAY_JOB: RouteKey = (REPLAY_JOB_EVENT, REPLAY_JOB_VERSION)
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


@dataclass
class _Held:
    """What the role opens while starting and closes after the drain."""

    pool: Pool | None = None
    nc: Any = None


async def run(settings: HandlerSettings, stop: asyncio.Event) -> int:
    """Serve until ``stop`` is set, then finish in-flight calls and close (the one
    lifecycle: :func:`serve`, the service's own server answering health)."""
    if not settings.service:
        raise ConfigurationError("no service given: use --service NAME or FERRY_SERVICE")
    settings.check_fault_injection()
    spec = service_spec(settings.service)
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    context = topology.context(spec.name)
    ports = listen_ports(settings, topology, spec.name)
    worker = _replay_worker(settings, topology, spec.name)
    routes = {REPLAY_JOB: replay_job_route(worker)} if spec.name in replay_workers(topology) else {}
    service = build_service(
        spec,
        pool=None,  # bound once PostgreSQL answers; 503 "starting" until then
        topology=topology,
        fault_injection=settings.handler_fault_injection,
        platform_routes=routes,
    )
    if service.fault_injection:
        log.warning(
            "FERRY_HANDLER_FAULT_INJECTION is on: payloads' _ferry_test directives are "
            "obeyed (a test setting; never in production)"
        )
    secrets = settings.verification_secrets()
    if not secrets:
        log.warning("FERRY_HANDLER_SECRETS is not set: requests are not authenticated")
    app = make_app(
        service=service, secrets=secrets, tolerance=settings.signature_tolerance, install=False
    )
    held = _Held()

    async def work(inner: asyncio.Event) -> None:
        await _serve(app, settings, ports, inner, start=lambda: _start(
            service, settings, context.database, worker, held, inner
        ))  # fmt: skip

    try:
        return await serve(
            settings=settings,
            work=work,
            checks={},
            stop=stop,
            drain_deadline=settings.drain_deadline,
            health_server=False,
        )
    except CONNECTION_ERRORS as exc:
        raise TransientError(f"the database failed: {exc}") from exc
    finally:
        if held.nc is not None:
            await held.nc.close()
        if held.pool is not None:
            await _close_pool(held.pool, settings.drain_deadline)


def _replay_worker(
    settings: HandlerSettings, topology: Topology, service: str
) -> ReplayJobWorker | None:
    """With FERRY_HANDLER_REPLAY_JOBS on, the platform's replay-job worker
    (:mod:`shared.ops.replay_jobs`) this service hosts, its NATS connection still to
    open (jobs wait with 503 until it is); None when off (the unbound route answers 503
    until a handler running them takes the job)."""
    if not settings.handler_replay_jobs:
        return None
    workers = replay_workers(topology)
    if service not in workers:
        raise ConfigurationError(
            f"FERRY_HANDLER_REPLAY_JOBS is on, but {service!r} runs no replay jobs in topology "
            f"{topology.name!r} (their handler: {', '.join(workers) or 'none'})"
        )
    return ReplayJobWorker(settings, topology, None, rate=settings.handler_replay_rate)


async def _start(
    service: HandlerService,
    settings: HandlerSettings,
    database: str,
    worker: ReplayJobWorker | None,
    held: _Held,
    stop: asyncio.Event,
) -> bool:
    """Open what the service needs, bind it and install the tables; False if stopped first."""
    held.pool = await _create_pool_retrying(settings.dsn(database), stop)
    if held.pool is None:
        return False
    if worker is not None:
        held.nc = worker.nc = await connect_nats(
            settings.nats_servers(),
            name=f"{ROLE_PREFIX}{service.name}",
            ping_interval=settings.nats_ping_interval,
            auth=settings.nats_auth(),
            give_up_after=NATS_WAIT,
        )
        pace = settings.handler_replay_rate or "no limit"
        log.info("running replay jobs (%s replays/s at most)", pace)
    service.bind(held.pool)
    await service.install()
    return True


async def _serve(
    app: web.Application,
    settings: HandlerSettings,
    ports: list[int],
    stop: asyncio.Event,
    *,
    start: Callable[[], Awaitable[bool]],
) -> None:
    """Listen at once (503 "starting"), ``start``, serve until ``stop``, then finish the
    calls in flight."""
    tls = _tls(settings)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.drain_deadline)
    await runner.setup()
    watching = asyncio.create_task(tls.watch(stop)) if tls is not None else None
    try:
        for port in ports:
            await _start_site(runner, settings.host, port, tls.context if tls else None)
        # Port 0 asks the OS for one; log the real ones so a caller can find us.
        bound = sorted({int(address[1]) for address in runner.addresses})
        scheme = "https" if tls is not None else "http"
        urls = ", ".join(f"{scheme}://{settings.host}:{p}/handle" for p in bound)
        log.info("serving on %s", urls)
        if not await start():
            return
        await stop.wait()
        log.info("stopping: finishing calls in flight")
    finally:
        if watching is not None:
            await cancel_and_wait(watching, 5.0)
        await runner.cleanup()


def _tls(settings: HandlerSettings) -> Reloading | None:
    """HTTPS when a certificate is set (reloaded on change; mutual TLS with a client CA)."""
    cert, key = settings.handler_tls_cert, settings.handler_tls_key
    if cert is None and key is None:
        if settings.handler_tls_client_ca is not None:
            raise ConfigurationError(
                "FERRY_HANDLER_TLS_CLIENT_CA is set without FERRY_HANDLER_TLS_CERT/_KEY"
            )
        return None
    if cert is None or key is None:
        raise ConfigurationError("FERRY_HANDLER_TLS_CERT and FERRY_HANDLER_TLS_KEY go together")
    return server_context(
        cert, key, client_ca=settings.handler_tls_client_ca, what="handler service HTTPS"
    )


async def _start_site(
    runner: web.AppRunner, host: str, port: int, tls: ssl.SSLContext | None = None
) -> None:
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


async def _create_pool_retrying(dsn: str, stop: asyncio.Event) -> Pool | None:
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


async def _close_pool(pool: Pool, deadline: float) -> None:
    try:
        await within(deadline, pool.close())
    except TimeoutError:
        pool.terminate()


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
    role = f"{ROLE_PREFIX}{settings.service or 'unknown'}"
    configure_logging(role, settings.log_level)
    return run_role(role, settings, run)


if __name__ == "__main__":
    sys.exit(main())
