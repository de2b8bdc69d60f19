"""``python -m services.console [--topology F]``: the operator console of one topology.

``python -m services.console hash-password`` reads a password (from the terminal, or one
line of standard input) and prints its scrypt hash for the accounts file.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import sys
from collections.abc import Iterable

from aiohttp import web

from shared.adapters.postgres import Pool, create_pool_when_up
from shared.contracts.lint import require_clean_topology
from shared.domain.errors import ConfigurationError
from shared.runtime.connections import Connected
from shared.runtime.lifecycle import serve, topology_role_main
from shared.runtime.metrics import RoleMetrics
from shared.runtime.tls import Reloading, server_context

from .app import Console
from .auth import Authenticator, hash_password, load_accounts, read_secret_file
from .settings import ConsoleSettings

ROLE = "console"
log = logging.getLogger("ferry.console")


def authenticator(settings: ConsoleSettings) -> Authenticator:
    """Accounts, token and session key from their files (see :mod:`services.console.auth`)."""
    key = read_secret_file(settings.console_session_key_file, "FERRY_CONSOLE_SESSION_KEY_FILE")
    auth = Authenticator(
        load_accounts(settings.console_accounts_file),
        key=None if key is None else key.encode(),
        token=read_secret_file(settings.console_token_file, "FERRY_CONSOLE_TOKEN_FILE"),
        token_role=settings.console_token_role,
        ttl=settings.console_session_ttl,
    )
    if not auth.configured:
        raise ConfigurationError(
            "nobody can sign in: set FERRY_CONSOLE_ACCOUNTS_FILE (accounts with password "
            "hashes) or FERRY_CONSOLE_TOKEN_FILE (a bearer token)"
        )
    return auth


async def run(settings: ConsoleSettings, stop: asyncio.Event) -> int:
    """Serve the console until ``stop`` (the one lifecycle: :func:`serve`)."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    auth = authenticator(settings)
    pools: dict[str, Pool] = {}
    nats = Connected()
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    console = Console(settings, topology, pools, lambda: nats.nc, auth, metrics)
    try:
        # The console's own server answers /healthz, /readyz (503 "starting" until the
        # pools and NATS are open, "stopping" once draining) and /metrics.
        return await serve(
            settings=settings,
            work=lambda inner: _serve(console, settings, topology.databases(), nats, inner),
            checks={},
            stop=stop,
            drain_deadline=settings.drain_deadline,
            metrics=metrics,
            health_server=False,
        )
    finally:
        console.ready, console.stopping = False, True
        if nats.nc is not None:
            await nats.nc.close()
        for pool in list(pools.values()):
            await pool.close()


async def _serve(
    console: Console,
    settings: ConsoleSettings,
    databases: Iterable[str],
    nats: Connected,
    stop: asyncio.Event,
) -> None:
    """Listen at once (503 while starting), open the pools and NATS, serve until ``stop``,
    then refuse new pages, stop the jobs and finish the requests in flight."""
    tls = _tls(settings)
    runner = web.AppRunner(console.app(), access_log=None)
    await runner.setup()
    sampler: asyncio.Task[None] | None = None
    watching = asyncio.ensure_future(tls.watch(stop)) if tls is not None else None
    try:
        site = web.TCPSite(
            runner,
            settings.console_host,
            settings.console_port,
            ssl_context=tls.context if tls is not None else None,
        )
        await site.start()
        log.info(
            "console of %s on %s://%s:%s/",
            console.topology.name,
            "https" if tls is not None else "http",
            settings.console_host,
            settings.console_port,
        )
        for database in databases:
            console.pools[database] = await create_pool_when_up(
                settings.dsn(database), max_size=4, stop=stop
            )
        await nats.open(settings, f"{ROLE}:{console.topology.name}")
        console.ready = True
        sampler = asyncio.ensure_future(console.sample_forever(stop))
        await stop.wait()
    finally:
        console.ready, console.stopping = False, True
        await console.jobs.stop(settings.drain_deadline)
        if sampler is not None:
            sampler.cancel()
        if watching is not None:
            watching.cancel()
        await runner.cleanup()


def _tls(settings: ConsoleSettings) -> Reloading | None:
    """HTTPS when a certificate is set (reloaded when its files change)."""
    cert, key = settings.console_tls_cert, settings.console_tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigurationError("FERRY_CONSOLE_TLS_CERT and FERRY_CONSOLE_TLS_KEY go together")
    return server_context(cert, key, what="console HTTPS")


def hash_password_main() -> int:
    """Print the scrypt hash of a password read from the terminal or standard input."""
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("the two passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 8:
        print("a password needs at least 8 characters", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["hash-password"]:
        return hash_password_main()
    return topology_role_main(role=ROLE, settings_class=ConsoleSettings, run=run, argv=args)


if __name__ == "__main__":
    sys.exit(main())
