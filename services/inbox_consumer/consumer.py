"""The inbox consumer built from keyword arguments: :func:`build_consumer`.

The role itself is built by its composition root (:mod:`.wiring`); this function builds
the same :class:`~.loop.ConsumerLoop`, assembled by :func:`.wiring.assemble` from the
settings a caller (a test, an embedding program) names one by one, with the durable's
adapters handed over (the pool, JetStream, the handler) and the rest made by the
composition root as the role makes them: PostgreSQL's inbox store, fresh stats and
metrics (watched), the durable's throttle.

What happens to a fetched batch is told where it happens: :mod:`.loop` (the run loop:
fetch, parse, hand over), :mod:`.pipeline` (the unordered stages: claim, decide,
settle) and :mod:`.ordering` (``ordering: key``).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.inbox_consumer.breaker import CircuitBreaker
from services.inbox_consumer.delivery import DEFAULT_MAX_MESSAGE_BYTES, Delivery, parse_delivery
from services.inbox_consumer.loop import ConsumerLoop
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from services.inbox_consumer.wiring import ConsumerConfig, assemble, watch
from shared.adapters.jetstream import JetStream
from shared.adapters.postgres import Conn, Pool
from shared.adapters.stores import PostgresInboxStore
from shared.contracts.topology import DurableSpec
from shared.domain.ack import RetryPolicy
from shared.domain.ports import HandlerPort, InboxStore
from shared.runtime.metrics import RoleMetrics

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "ConsumerLoop",
    "ConsumerStats",
    "Delivery",
    "build_consumer",
    "parse_delivery",
]


def build_consumer(
    *,
    pool: Pool,
    js: JetStream,
    durable: str,
    spec: DurableSpec,
    handler: HandlerPort,
    owner: str,
    concurrency: int,
    lease_seconds: float,
    policy: RetryPolicy,
    accepted: frozenset[tuple[str, int]] | None,
    metrics: ConsumerMetrics | None = None,
    store: InboxStore[Conn] | None = None,
    stats: ConsumerStats | None = None,
    partition: int = 0,
    js_consumer: str | None = None,
    key_fields: Mapping[tuple[str, int], str | None] | None = None,
    throttle: Throttle | None = None,
    breaker: CircuitBreaker | None = None,
) -> ConsumerLoop:
    """A consumer of one durable (or one partition of it) into its inbox and handler. Its
    handler and the pauses while the handler refuses our credentials are the decider's
    (``loop.decider.handler``, ``loop.decider.auth_retry``); its pool the holder's."""
    config = ConsumerConfig(
        durable=durable, spec=spec, owner=owner, concurrency=concurrency,
        lease_seconds=lease_seconds, policy=policy, accepted=accepted,
        key_fields=key_fields or {},
    )  # fmt: skip
    metrics = metrics or ConsumerMetrics(
        RoleMetrics("inbox-consumer"), durable=durable, stream=spec.stream
    )
    if stats is None:  # partitions of one durable share stats, watched once
        stats = ConsumerStats()
        watch(metrics, stats, pool, js, spec)
    breaker = breaker or CircuitBreaker(spec.circuit_breaker, durable=durable)
    if throttle is None:
        throttle = Throttle(durable, spec)
        throttle.circuit = breaker.report
    parts = assemble(
        config, pool=pool, js=js, handler=handler, store=store or PostgresInboxStore(),
        stats=stats, metrics=metrics, throttle=throttle, breaker=breaker,
        partition=partition, js_consumer=js_consumer,
    )  # fmt: skip
    return ConsumerLoop(parts)
