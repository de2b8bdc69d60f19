"""``python -m services.outbox_publisher [--context NAME]``: wires settings to the publisher."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.outbox_publisher.metrics import PublisherMetrics
from shared.adapters.nats import connect_nats
from shared.adapters.notify import listen
from shared.adapters.postgres import create_pool_when_up
from shared.contracts.lint import PublisherTiming, require_clean_topology
from shared.contracts.topology import ContextSpec
from shared.domain.errors import ConfigurationError
from shared.runtime.lifecycle import run_role, serve
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import RoleMetrics
from shared.runtime.settings import PublisherSettings
from shared.telemetry import set_log_fields

from .messages import ordering_fields_of
from .publisher import OutboxPublisher
from .watch import MIN_PERIOD, OutboxWatch

ROLE = "outbox-publisher"
log = logging.getLogger("ferry.outbox_publisher")


async def run(settings: PublisherSettings, stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``), then drain inside the deadline."""
    stop = stop or asyncio.Event()
    set_log_fields(context=settings.context)
    topology = settings.load_topology()
    # With this publisher's own timing: the duplicate window must cover its re-publishes.
    require_clean_topology(
        topology, source=settings.topology, publisher=PublisherTiming.of(settings)
    )
    context = topology.context(settings.context)
    if context.stream is None:
        raise ConfigurationError(f"context {settings.context!r} owns no stream to publish to")
    dsn = settings.dsn(context.database)
    pool = await create_pool_when_up(dsn, max_size=settings.concurrency + 1, stop=stop)
    nats_up = {"connected": False}
    nc = await connect_nats(
        settings.nats_servers(),
        name=f"{ROLE}:{settings.context}",
        ping_interval=settings.nats_ping_interval,
        auth=settings.nats_auth(),
        on_state=lambda up: nats_up.__setitem__("connected", up),
    )
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    publisher_metrics = PublisherMetrics(
        metrics, context=settings.context, stream=context.stream.name
    )
    publisher_metrics.watch_outbox(pool)
    publisher = OutboxPublisher(
        pool=pool,
        js=nc.jetstream(),
        context=settings.context,
        namespace=context.namespace,
        stream=context.stream.name,
        batch_size=settings.batch_size,
        publish_timeout=settings.publish_timeout,
        retry_initial=settings.retry_initial,
        retry_max=settings.retry_max,
        metrics=publisher_metrics,
        max_publish_attempts=settings.max_publish_attempts,
        max_message_bytes=context.stream.max_msg_size,
        partitions=context.stream.partitions,
        ordering_fields=ordering_fields_of(topology, settings.context),
        atomic_batches=settings.atomic_batches,
        atomic_min_rows=settings.atomic_min_rows,
        nc=nc,
    )
    publisher.linger = settings.linger
    publisher.fill_linger = fill_linger(settings, context)
    if settings.publisher_watch:
        publisher.watch = OutboxWatch(
            pool, publisher, period=watch_period(publisher), poll_interval=settings.poll_interval,
            metrics=publisher_metrics,
        )  # fmt: skip
    listener_stop = asyncio.Event()
    listener = asyncio.create_task(listen(dsn, "ferry_outbox", publisher.notify, listener_stop))
    log.info("publishing context %s into %s", settings.context, context.stream.name)
    try:
        # At the drain deadline the workers are cancelled, rolling back their claims.
        return await serve(
            settings=settings,
            work=lambda inner: _workers(publisher, inner, settings),
            checks={
                "nats": lambda: nats_up["connected"],
                "postgres": lambda: publisher.stats.last_db_ok,
            },
            stop=stop,
            drain_deadline=settings.drain_deadline,
            metrics=metrics,
        )
    finally:
        listener_stop.set()
        await asyncio.gather(listener, return_exceptions=True)
        await nc.close()
        await pool.close()
        log.info("stopped", extra={"published": publisher.stats.published})


def fill_linger(settings: PublisherSettings, context: ContextSpec) -> float:
    """FERRY_PUBLISHER_LINGER when set, else the context's ``publisher_linger`` from the
    topology, else the setting's default."""
    if "publisher_linger" in settings.model_fields_set or context.publisher_linger is None:
        return settings.publisher_linger
    return context.publisher_linger


def watch_period(publisher: OutboxPublisher) -> float:
    """The watch's period: the linger a woken worker would wait (at least 5 ms)."""
    return max(publisher.fill_linger, publisher.linger, MIN_PERIOD)


async def _workers(
    publisher: OutboxPublisher, stop: asyncio.Event, settings: PublisherSettings
) -> None:
    """``settings.concurrency`` workers until ``stop``, each finishing its batch in flight,
    the sweep of rows behind set-aside rows, and the outbox watch (which deletes its
    promise when stopped)."""
    workers = [
        publisher.run_worker(stop, poll_interval=settings.poll_interval)
        for _ in range(settings.concurrency)
    ]
    workers.append(publisher.sweep_waiting(stop))
    if publisher.watch is not None:
        workers.append(publisher.watch.run(stop))
    await asyncio.gather(*workers, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--context`` overrides FERRY_CONTEXT."""
    parser = argparse.ArgumentParser(prog="python -m services.outbox_publisher")
    parser.add_argument("--context", help="context to publish (default: FERRY_CONTEXT)")
    args = parser.parse_args(argv)
    overrides = {"context": args.context} if args.context else {}
    settings = PublisherSettings(**overrides)
    configure_logging(ROLE, settings.log_level)
    return run_role(ROLE, settings, run)


if __name__ == "__main__":
    sys.exit(main())
