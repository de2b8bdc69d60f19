"""``python -m services.dlq_replayer``: automatic replays of the topology's dead letters."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from shared.domain.errors import AccessDenied, ConfigurationError
from shared.lint import require_clean_topology
from shared.metrics import ReplayerMetrics, RoleMetrics
from shared.runtime import (
    EXIT_CONFIG,
    EXIT_CONNECT,
    configure_logging,
    postgres_probes,
    stop_on_signals,
)
from shared.settings import ReplayerSettings
from shared.telemetry import setup_tracing
from shared.wiring import Connected, close_all, serve, target_pools

from .replayer import DlqReplayer

ROLE = "dlq-replayer"
log = logging.getLogger("ferry.dlq_replayer")


async def run(settings: ReplayerSettings, stop: asyncio.Event) -> int:
    """Replay until ``stop``."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    pools = await target_pools(settings, topology, stop)
    nats = Connected()
    nc = await nats.open(settings, f"{ROLE}:{topology.name}")
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    replayer = DlqReplayer(
        topology=topology,
        pools=pools,
        js=nc.jetstream(),
        batch_size=settings.batch_size,
        metrics=ReplayerMetrics(metrics),
    )
    automatic = replayer.automatic() or ["none: every durable is operator-only"]
    log.info("replaying dead letters of %s (automatic: %s)", topology.name, ", ".join(automatic))
    try:
        return await serve(
            settings=settings,
            work=lambda inner: replayer.run(inner, interval=settings.interval),
            checks={
                "nats": lambda: nats.up,
                "postgres": postgres_probes(pools),
                "scanning": lambda: replayer.ready,
            },
            stop=stop,
            drain_deadline=settings.drain_deadline,
            metrics=metrics,
        )
    finally:
        await close_all(nc, pools)
        log.info("stopped", extra={"replayed": replayer.stats.replayed})


async def _main(settings: ReplayerSettings) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    tracing = setup_tracing(ROLE, settings)
    try:
        return await run(settings, stop)
    finally:
        tracing.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--topology`` overrides FERRY_TOPOLOGY."""
    parser = argparse.ArgumentParser(prog="python -m services.dlq_replayer")
    parser.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    args = parser.parse_args(argv)
    settings = ReplayerSettings(**({"topology": args.topology} if args.topology else {}))
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
