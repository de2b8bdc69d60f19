"""``python -m services.dlq_router``: the topology's advisories → dead-letter records."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from shared.domain.errors import AccessDenied, ConfigurationError
from shared.lint import require_clean_topology
from shared.metrics import RoleMetrics, RouterMetrics
from shared.runtime import (
    EXIT_CONFIG,
    EXIT_CONNECT,
    configure_logging,
    postgres_probes,
    stop_on_signals,
)
from shared.settings import RouterSettings
from shared.telemetry import setup_tracing
from shared.wiring import Connected, close_all, serve, target_pools

from .router import DlqRouter

ROLE = "dlq-router"
log = logging.getLogger("ferry.dlq_router")


async def run(settings: RouterSettings, stop: asyncio.Event) -> int:
    """Route advisories until ``stop``."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    pools = await target_pools(settings, topology, stop)
    nats = Connected()
    nc = await nats.open(settings, f"{ROLE}:{topology.name}")
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    router = DlqRouter(
        topology=topology, pools=pools, js=nc.jetstream(), metrics=RouterMetrics(metrics)
    )
    log.info("routing advisories of %s from %s", topology.name, topology.advisory_stream)
    try:
        return await serve(
            settings=settings,
            work=lambda inner: router.run(inner, fetch_timeout=settings.fetch_timeout),
            checks={
                "nats": lambda: nats.up,
                "postgres": postgres_probes(pools),
                "durable": lambda: router.stats.bound,
            },
            stop=stop,
            drain_deadline=settings.drain_deadline + settings.fetch_timeout,
            metrics=metrics,
        )
    finally:
        await close_all(nc, pools)
        log.info("stopped", extra={"recorded": router.stats.recorded})


async def _main(settings: RouterSettings) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    tracing = setup_tracing(ROLE, settings)
    try:
        return await run(settings, stop)
    finally:
        tracing.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    parser = argparse.ArgumentParser(prog="python -m services.dlq_router")
    parser.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    args = parser.parse_args(argv)
    settings = RouterSettings(**({"topology": args.topology} if args.topology else {}))
    configure_logging(ROLE, settings.log_level)
    try:
        return asyncio.run(_main(settings))
    except AccessDenied as exc:
        log.error("%s", exc)
        return EXIT_CONNECT
    except ConfigurationError as exc:
        log.error("configuration error: %s", exc)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
