"""The composition root of the inbox consumer: the one place that builds collaborators.

Every class of the role is handed its collaborators here, explicitly; none builds a
default adapter of its own, and nothing is set on an object after it is built.

* :func:`wire` — the role's process (``python -m services.inbox_consumer``): settings to
  the adapters (the pool, NATS, the HTTP handler, metrics, the throttle), one
  :class:`~.loop.ConsumerLoop` per partition, and, for ``ordering: key``, the partition
  ownership that runs them; :class:`Wired` holds what the lifecycle needs.
* :func:`assemble` — one consumer (one durable, or one partition of it) from its
  :class:`ConsumerConfig` and the adapters: keep-alive, holder, settler, decider, claim,
  the unordered stages and, for ``ordering: key``, the key order, drainer and sequencer
  (a :class:`~.loop.ConsumerLoop` runs them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.inbox_consumer.batching import BatchCaller, BatchGatherer
from services.inbox_consumer.breaker import CircuitBreaker
from services.inbox_consumer.claiming import Claimer
from services.inbox_consumer.deciding import AUTH_RETRY, Decider
from services.inbox_consumer.delivery import DEFAULT_MAX_MESSAGE_BYTES
from services.inbox_consumer.dispatch import HttpHandler
from services.inbox_consumer.holding import Holder
from services.inbox_consumer.keepalive import KeepAlive
from services.inbox_consumer.loop import (
    DEFAULT_PIPELINE,
    INBOX_RETRY_INITIAL,
    INBOX_RETRY_MAX,
    ConsumerLoop,
    Parts,
)
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.ordering import Drainer, KeyOrder, Sequencer
from services.inbox_consumer.partition_share import lease_validity
from services.inbox_consumer.partition_slot import NotSettled
from services.inbox_consumer.partitions import PartitionOwnership
from services.inbox_consumer.pipeline import Unordered
from services.inbox_consumer.puller import ORDERED_REQUEST_EXPIRES
from services.inbox_consumer.replies import Replies
from services.inbox_consumer.settlement import Settler
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from shared.adapters.jetstream import JetStream
from shared.adapters.jetstream_answers import Answers
from shared.adapters.nats import NatsClient, connect_nats
from shared.adapters.postgres import Conn, Pool, create_pool_when_up
from shared.adapters.stores import PostgresInboxStore
from shared.contracts.events import AcceptedEvents
from shared.contracts.events import accepted_events as registry_accepted
from shared.contracts.lint import require_clean_topology
from shared.contracts.topology import DurableSpec, Topology
from shared.domain.ack import RetryPolicy
from shared.domain.errors import ConfigurationError
from shared.domain.ports import HandlerPort, InboxStore
from shared.runtime.metrics import RoleMetrics
from shared.runtime.readiness import ReadinessCheck, postgres_probe
from shared.runtime.settings import ConsumerSettings
from shared.runtime.tls import Reloading, client_context
from shared.waits import cancel_and_wait

ROLE = "inbox-consumer"
#: Longest a nak or term is retried until JetStream confirms it (a failover takes seconds).
CONFIRM_AT_MOST = 10.0
#: Longest an ack is remembered for re-sending after a leader change or a reconnect.
REMEMBER_ACKS_AT_MOST = 15.0
log = logging.getLogger("ferry.inbox_consumer")


def ordering_keys(topology: Topology, durable: str) -> dict[tuple[str, int], str | None]:
    """Per event the durable takes, the payload field its ordering key is read from (None:
    the aggregate)."""
    return {(e.type, e.version): e.ordering_key for e in topology.events if durable in e.handled_by}


def accepted_events(topology: Topology, durable: str) -> AcceptedEvents | None:
    """(type, version) pairs the generated registry routes to ``durable``, each with its
    payload validator; None when the topology declares no events."""
    return registry_accepted(topology, durable)


@dataclass(frozen=True)
class ConsumerConfig:
    """What one durable's consumers are told (the same for each of its partitions)."""

    durable: str
    spec: DurableSpec
    owner: str
    concurrency: int
    lease_seconds: float
    policy: RetryPolicy
    accepted: frozenset[tuple[str, int]] | None
    key_fields: Mapping[tuple[str, int], str | None] = field(default_factory=dict)
    auth_retry: tuple[float, float] = AUTH_RETRY
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    pipeline: int = DEFAULT_PIPELINE
    linger: float = 0.0


def watch(metrics: ConsumerMetrics, stats: ConsumerStats, pool: Any, js: Any, spec: Any) -> None:
    """Export a durable's stats, backlog and lag (once per durable: its partitions share
    ``stats``), and its parked keys when ordered."""
    metrics.watch(stats, pool, js)
    if spec.ordering == "key":
        metrics.watch_parking(pool)


def assemble(
    config: ConsumerConfig,
    *,
    pool: Pool,
    js: JetStream,
    handler: HandlerPort,
    store: InboxStore[Conn],
    stats: ConsumerStats,
    metrics: ConsumerMetrics,
    throttle: Throttle,
    breaker: CircuitBreaker,
    partition: int = 0,
    js_consumer: str | None = None,
) -> Parts:
    """One consumer's object graph, each piece handed its collaborators."""
    durable, spec, policy = config.durable, config.spec, config.policy
    heartbeat_every = max(spec.ack_wait / 3, 0.5)
    keeper = KeepAlive(heartbeat_every)
    replies = Replies(keeper)
    # A nak is retried until confirmed for less than the time JetStream takes to redeliver
    # the message by itself (its last heartbeat, at most a third of ack_wait ago, plus
    # ack_wait); acks are remembered long enough to be re-sent after a leader change.
    answers = Answers(
        confirm_within=min(spec.ack_wait / 2, CONFIRM_AT_MOST),
        remember_for=min(spec.ack_wait, REMEMBER_ACKS_AT_MOST),
        stats=stats.answers,
    )

    def inbox_failed() -> None:
        stats.inbox_unavailable += 1

    holder = Holder(
        pool,
        first_pause=INBOX_RETRY_INITIAL,
        longest_pause=min(INBOX_RETRY_MAX, heartbeat_every),
        on_failure=inbox_failed,
    )
    settler = Settler(
        pool=pool, js=js, store=store, durable=durable, spec=spec, policy=policy,
        replies=replies, holder=holder, stats=stats, metrics=metrics,
    )  # fmt: skip
    unexpected = settler.unexpected
    decider = Decider(
        durable=durable, spec=spec, handler=handler, policy=policy, accepted=config.accepted,
        concurrency=config.concurrency, keeper=keeper, stats=stats, metrics=metrics,
        unexpected=unexpected, auth_retry=config.auth_retry, breaker=breaker,
    )  # fmt: skip
    claimer = Claimer(
        store=store, holder=holder, replies=replies, stats=stats, durable=durable,
        owner=config.owner,
        lease_seconds=config.lease_seconds, policy=policy, unexpected=unexpected,
    )  # fmt: skip
    caller = None
    if spec.handler.batch > 1:  # N events per handler call (.batching)
        caller = BatchCaller(decider, size=spec.handler.batch, unexpected=unexpected)
    ordered = spec.ordering == "key"
    unordered = Unordered(
        claimer=claimer, decider=decider, batcher=None if ordered else caller,
        settler=settler, durable=durable, stream=spec.stream,
    )  # fmt: skip
    sequencer = None
    if ordered:
        order = KeyOrder(
            pool=pool, holder=holder, decider=decider,
            gatherer=BatchGatherer(caller) if caller is not None else None,
            settler=settler, replies=replies, stats=stats, durable=durable, spec=spec,
            policy=policy, partition=partition, key_fields=config.key_fields,
        )  # fmt: skip
        drainer = Drainer(
            order, claimer=claimer, store=store, metrics=metrics, owner=config.owner,
            max_message_bytes=config.max_message_bytes, unexpected=unexpected,
        )  # fmt: skip
        sequencer = Sequencer(
            order, drainer=drainer, claimer=claimer, unordered=unordered, owner=config.owner
        )
    return Parts(
        js=js, durable=durable, spec=spec, js_consumer=js_consumer or durable,
        partition=partition, policy=policy, stats=stats, metrics=metrics, throttle=throttle,
        keeper=keeper, replies=replies, answers=answers, holder=holder, decider=decider,
        settler=settler,
        unordered=unordered, sequencer=sequencer, max_message_bytes=config.max_message_bytes,
        pipeline=config.pipeline, linger=config.linger,
    )  # fmt: skip


Work = Callable[[asyncio.Event], Awaitable[None]]


@dataclass
class Wired:
    """The role's process, built: what the lifecycle runs, checks and closes."""

    metrics: RoleMetrics
    work: Work
    checks: dict[str, ReadinessCheck]
    stats: ConsumerStats
    closers: list[Callable[[], Awaitable[Any]]]

    async def close(self) -> None:
        """Close the adapters, last built first closed."""
        for close in self.closers:
            await close()


async def wire(settings: ConsumerSettings, stop: asyncio.Event) -> Wired:
    """Settings to the role's object graph (see the module doc)."""
    topology = settings.load_topology()
    require_clean_topology(topology, source=settings.topology)
    spec = topology.durable(settings.durable)
    dsn = settings.dsn(topology.context(spec.target).database)
    plans = topology.consumers(settings.durable)
    closers: list[Callable[[], Awaitable[Any]]] = []
    # Each partition this replica may own has its batches and its drainer.
    pool = await create_pool_when_up(dsn, max_size=min(4 + 2 * (len(plans) - 1), 20), stop=stop)
    closers.append(pool.close)
    nats_up = {"connected": False}
    loops: list[ConsumerLoop] = []
    resending: set[asyncio.Task[None]] = set()

    def nats_state(up: bool) -> None:
        # Back after a disconnect: acks sent just before it may never have arrived.
        if up and nats_up["connected"] is False and loops:
            for consumer in loops:
                task = asyncio.ensure_future(consumer.reconnected())
                resending.add(task)
                task.add_done_callback(resending.discard)
        nats_up["connected"] = up

    nc: NatsClient = await connect_nats(
        settings.nats_servers(),
        name=f"{ROLE}:{settings.durable}",
        ping_interval=settings.nats_ping_interval,
        auth=settings.nats_auth(),
        on_state=nats_state,
    )
    closers.insert(0, nc.close)
    secret = settings.signing_secret()
    if secret is None:
        log.warning("FERRY_HANDLER_SECRET is not set: handler calls are not signed")
    url = settings.handler_url or spec.handler.url
    tls = _handler_tls(settings, url)
    handler = HttpHandler(
        url,
        timeout=spec.handler.timeout,
        connections=settings.concurrency,
        durable=settings.durable,
        secret=secret,
        tls=tls.context if tls is not None else None,
    )
    closers.insert(0, handler.close)
    metrics = RoleMetrics(ROLE, refresh_interval=settings.metrics_refresh_interval)
    consumer_metrics = ConsumerMetrics(
        metrics, durable=settings.durable, stream=spec.stream, consumers=[p.name for p in plans]
    )
    owner = f"{socket.gethostname()}:{os.getpid()}"
    config = ConsumerConfig(
        durable=settings.durable,
        spec=spec,
        owner=owner,
        concurrency=settings.concurrency,
        lease_seconds=spec.handler.timeout + settings.lease_margin,
        policy=RetryPolicy(tuple(spec.backoff), spec.max_deliver, settings.retry_after_cap),
        accepted=accepted_events(topology, settings.durable),
        key_fields=ordering_keys(topology, settings.durable),
        auth_retry=(settings.auth_retry_initial, settings.auth_retry_max),
        max_message_bytes=settings.max_message_bytes,
        pipeline=settings.pipeline,
        linger=settings.linger,
    )
    js = nc.jetstream()
    # One rate limit per process, shared by the partitions (INFRA-005 §7.3); one circuit
    # breaker per process too: the partitions call the same handler.
    throttle = Throttle(settings.durable, spec)
    breaker = CircuitBreaker(spec.circuit_breaker, durable=settings.durable)
    consumer_metrics.watch_breaker(breaker)
    throttle.circuit = breaker.report  # reported with its heartbeat, for the console
    metrics.add_collector(throttle.families)
    stats = ConsumerStats()  # the partitions of one durable share it, watched once
    watch(consumer_metrics, stats, pool, js, spec)
    store = PostgresInboxStore()
    consumers = {
        p.partition or 0: ConsumerLoop(assemble(
            config, pool=pool, js=js, handler=handler, store=store, stats=stats,
            metrics=consumer_metrics, throttle=throttle, breaker=breaker,
            partition=p.partition or 0,
            js_consumer=p.name,
        ))
        for p in plans
    }  # fmt: skip
    loops.extend(consumers.values())
    ownership: PartitionOwnership | None = None
    if spec.ordering == "key":
        # Renewals get connections of their own: queued behind inbox writes under load, a
        # renewal could come too late and the replica would fence itself.
        lease_pool = await create_pool_when_up(dsn, max_size=2, stop=stop)
        closers.append(lease_pool.close)
        ownership = _ownership(
            lease_pool, js, consumers, settings, spec, [p.name for p in plans], owner
        )
        consumer_metrics.watch_ownership(ownership)
        stats.bound = True  # readiness: the ownership loop runs (it may own none)
        log.info(
            "consuming %s from %s in key order over %d partition(s)",
            settings.durable, spec.stream, len(plans),
        )  # fmt: skip
    else:
        log.info("consuming %s from %s", settings.durable, spec.stream)

    async def work(inner: asyncio.Event) -> None:
        # A renewed certificate of the handler hop is loaded when its files change.
        watching = asyncio.create_task(tls.watch(inner)) if tls is not None else None
        try:
            await _work(inner)
        finally:
            if watching is not None:
                await cancel_and_wait(watching, 5.0)

    async def _work(inner: asyncio.Event) -> None:
        # Operator overrides of the throttle, read every few seconds (ferry durable throttle).
        async with throttle.watching(pool, inner, settings.throttle_poll_interval):
            if ownership is not None:
                await ownership.run(inner)
            else:
                await consumers[0].run(inner, fetch_timeout=settings.fetch_timeout)

    checks: dict[str, ReadinessCheck] = {
        "nats": lambda: nats_up["connected"],
        "postgres": postgres_probe(pool),
        "durable": lambda: stats.bound,
    }
    return Wired(metrics=metrics, work=work, checks=checks, stats=stats, closers=closers)


def _handler_tls(settings: ConsumerSettings, url: str) -> Reloading | None:
    """The handler hop's TLS: for an https:// URL (the system's CAs unless
    FERRY_HANDLER_TLS_CA), with our client certificate when one is set."""
    files = (settings.handler_tls_ca, settings.handler_tls_cert, settings.handler_tls_key)
    if not url.lower().startswith("https://"):
        if any(files):
            raise ConfigurationError(
                f"FERRY_HANDLER_TLS_* is set but the handler URL {url} is not https://"
            )
        return None
    return client_context(
        settings.handler_tls_ca,
        cert=settings.handler_tls_cert,
        key=settings.handler_tls_key,
        what=f"handler hop of {settings.durable}",
    )


def _ownership(
    lease_pool: Pool,
    js: JetStream,
    consumers: dict[int, ConsumerLoop],
    settings: ConsumerSettings,
    spec: DurableSpec,
    names: list[str],
    owner: str,
) -> PartitionOwnership:
    """The leases of an ordered durable's partitions: one partition consumer at a time per
    replica and partition."""
    ownership: PartitionOwnership | None = None

    async def in_flight(k: int) -> int:
        info = await js.consumer_info(spec.stream, names[k])
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
        if not consumers[k].settled:
            raise NotSettled(consumers[k].unsettled)

    # What this replica fetched is redeliverable at most this long after it stops: its last
    # heartbeat's ack_wait, or the last message its last pull request could bring.
    hold, ttl = spec.ack_wait + ORDERED_REQUEST_EXPIRES, settings.lease_ttl(spec.ack_wait)
    if lease_validity(ttl, hold) <= 0:
        raise ConfigurationError(
            f"FERRY_PARTITION_LEASE_TTL={ttl:g} is too short for "
            f"the ordered durable {settings.durable}: an owner may work on a partition only "
            f"while its lease outlasts the durable's ack_wait ({spec.ack_wait:g}s, in the "
            f"topology) plus its pull requests' lifetime ({ORDERED_REQUEST_EXPIRES:g}s) and a "
            "margin; "
            "raise the ttl or shorten ack_wait (heartbeats keep long handler calls alive)"
        )
    ownership = PartitionOwnership(
        lease_pool,
        durable=settings.durable,
        partitions=len(names),
        owner=owner,
        ttl=ttl,
        hold=hold,
        work=partition_work,
        pending=in_flight,
    )
    return ownership
