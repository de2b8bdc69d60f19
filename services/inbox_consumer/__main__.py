"""``python -m services.inbox_consumer [--durable NAME]``: wires settings to the consumer."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

import asyncpg

from services.inbox_consumer.metrics import ConsumerMetrics
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import create_pool_when_up
from shared.contracts.events import AcceptedEvents
from shared.contracts.events import accepted_events as registry_accepted
from shared.contracts.lint import require_clean_topology
from shared.contracts.topology import Topology
from shared.domain.ack import RetryPolicy
from shared.runtime.lifecycle import run_role, serve
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import RoleMetrics
from shared.runtime.readiness import postgres_probe
from shared.runtime.settings import ConsumerSettings

from .consumer import InboxConsumer
from .dispatch import HttpHandler
from .partitions import PartitionOwnership
from .stats import ConsumerStats
from .throttle import Throttle

ROLE = "inbox-consumer"
log = logging.getLogger("ferry.inbox_consumer")


def ordering_keys(topology: Topology, durable: str) -> dict[tuple[str, int], str | None]:
    """Per event the durable takes, the payload field its ordering key is read from (None:
    the aggregate)."""
    return {(e.type, e.version): e.ordering_key for e in topology.events if durable in e.handled_by}


def accepted_events(topology: Topology, durable: str) -> AcceptedEvents | None:
    """(type, version) pairs the generated registry routes to ``durable``, each with its
    payload validator; None when the topology declares no events."""
    return registry_accepted(topology, durable)


async def run(settings: ConsumerSettings, stop: asyncio.Event) -> int:
    """Consume until ``stop``, then finish the batch in hand inside the drain deadline."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    spec = topology.durable(settings.durable)
    dsn = settings.dsn(topology.context(spec.target).database)
    plans = topology.consumers(settings.durable)
    # Each partition this replica may own has its batches and its drainer.
    pool = await create_pool_when_up(dsn, max_size=min(4 + 2 * (len(plans) - 1), 20), stop=stop)
    nats_up = {"connected": False}
    nc = await connect_nats(
        settings.nats_servers(),
        name=f"{ROLE}:{settings.durable}",
        ping_interval=settings.nats_ping_interval,
        auth=settings.nats_auth(),
        on_state=lambda up: nats_up.__setitem__("connected", up),
    )
    secret = settings.signing_secret()
    if secret is None:
        log.warning("FERRY_HANDLER_SECRET is not set: handler calls are not signed")
    handler = HttpHandler(
        settings.handler_url or spec.handler.url,
        timeout=spec.handler.timeout,
        connections=settings.concurrency,
        durable=settings.durable,
        secret=secret,
    )
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    consumer_metrics = ConsumerMetrics(
        metrics, durable=settings.durable, stream=spec.stream, consumers=[p.name for p in plans]
    )
    owner = f"{socket.gethostname()}:{os.getpid()}"
    accepted = accepted_events(topology, settings.durable)
    key_fields = ordering_keys(topology, settings.durable)
    js = nc.jetstream()
    # One rate limit per process, shared by the partitions (INFRA-005 §7.3).
    throttle = Throttle(settings.durable, spec)
    metrics.add_collector(throttle.families)

    def build(partition: int, name: str, stats: ConsumerStats | None) -> InboxConsumer:
        built = InboxConsumer(
            pool=pool,
            js=js,
            durable=settings.durable,
            spec=spec,
            handler=handler,
            owner=owner,
            concurrency=settings.concurrency,
            lease_seconds=spec.handler.timeout + settings.lease_margin,
            policy=RetryPolicy(tuple(spec.backoff), spec.max_deliver, settings.retry_after_cap),
            accepted=accepted,
            metrics=consumer_metrics,
            stats=stats,
            partition=partition,
            js_consumer=name,
            key_fields=key_fields,
            throttle=throttle,
        )
        built.auth_retry = (settings.auth_retry_initial, settings.auth_retry_max)
        built.max_message_bytes = settings.max_message_bytes
        built.pipeline = settings.pipeline
        built.linger = settings.linger
        return built

    consumer = build(0, plans[0].name, None)
    ownership: PartitionOwnership | None = None
    lease_pool: asyncpg.Pool | None = None
    if spec.ordering == "key":
        # One partition consumer at a time per replica and partition, under a lease.
        consumers = {p.partition or 0: build(p.partition or 0, p.name, consumer.stats)
                     for p in plans}  # fmt: skip
        consumers[0] = consumer

        async def in_flight(k: int) -> int:
            info = await js.consumer_info(spec.stream, plans[k].name)
            return int(info.num_ack_pending or 0)

        async def partition_work(k: int, stop_k: asyncio.Event) -> None:
            running = asyncio.create_task(
                consumers[k].run(stop_k, fetch_timeout=settings.fetch_timeout)
            )
            stopped = asyncio.create_task(stop_k.wait())
            try:
                await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
                assert ownership is not None
                if not running.done() and ownership.lost(k):
                    consumers[k].fence()  # abandon, do not finish: the lease is gone
                await running
            finally:
                stopped.cancel()

        # Renewals get connections of their own: queued behind inbox writes under load, a
        # renewal could come too late and the replica would fence itself.
        lease_pool = await create_pool_when_up(dsn, max_size=2, stop=stop)
        ownership = PartitionOwnership(
            lease_pool,
            durable=settings.durable,
            partitions=len(plans),
            owner=owner,
            ttl=settings.partition_lease_ttl,
            ack_wait=spec.ack_wait,
            work=partition_work,
            pending=in_flight,
        )
        consumer_metrics.watch_ownership(ownership)
        consumer.stats.bound = True  # readiness: the ownership loop runs (it may own none)
        log.info(
            "consuming %s from %s in key order over %d partition(s)",
            settings.durable, spec.stream, len(plans),
        )  # fmt: skip
    else:
        log.info("consuming %s from %s", settings.durable, spec.stream)

    async def work(inner: asyncio.Event) -> None:
        # Operator overrides of the throttle, read every few seconds (ferry durable throttle).
        async with throttle.watching(pool, inner, settings.throttle_poll_interval):
            if ownership is not None:
                await ownership.run(inner)
            else:
                await consumer.run(inner, fetch_timeout=settings.fetch_timeout)

    try:
        # Unacked messages of a drain that times out are redelivered after ack_wait.
        return await serve(
            settings=settings,
            work=work,
            checks={
                "nats": lambda: nats_up["connected"],
                "postgres": postgres_probe(pool),
                "durable": lambda: consumer.stats.bound,
            },
            stop=stop,
            drain_deadline=settings.drain_deadline + settings.fetch_timeout,
            metrics=metrics,
        )
    finally:
        await handler.close()
        await nc.close()
        await pool.close()
        if lease_pool is not None:
            await lease_pool.close()
        log.info("stopped", extra={"processed": consumer.stats.processed})


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``--durable`` overrides FERRY_DURABLE."""
    parser = argparse.ArgumentParser(prog="python -m services.inbox_consumer")
    parser.add_argument("--durable", help="durable to consume (default: FERRY_DURABLE)")
    args = parser.parse_args(argv)
    settings = ConsumerSettings(**({"durable": args.durable} if args.durable else {}))
    configure_logging(ROLE, settings.log_level)
    return run_role(ROLE, settings, run)


if __name__ == "__main__":
    sys.exit(main())
