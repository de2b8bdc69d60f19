"""The JetStream configs provisioning declares: the caps of a smaller deployment, each
stream's config (event, dead-letter and advisory streams), each durable's consumer (and
its partitions' metadata keys), and the dlq-router's consumer on the advisory stream."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import api as js_api

from shared.contracts.topology import (
    ConsumerPlan,
    DeadLetterStreamSpec,
    DurableSpec,
    StreamSpec,
    Topology,
)
from shared.domain.subjects import (
    advisory_subjects,
    replay_subject,
    replay_wildcard,
)

#: Consumer metadata keys provisioning writes on a partition's consumer.
META_PARTITION = "ferry.partition"
META_PARTITIONS = "ferry.partitions"


@dataclass(frozen=True)
class Caps:
    """Limits of a smaller deployment (the dev stack) applied over the topology's values."""

    #: At most this many replicas (a single dev server cannot hold 3).
    max_replicas: int | None = None
    #: At most this many bytes per stream (JetStream reserves max_bytes up front).
    max_bytes: int | None = None

    def replicas(self, wanted: int) -> int:
        """``wanted`` capped."""
        return wanted if self.max_replicas is None else min(wanted, self.max_replicas)

    def bytes(self, wanted: int) -> int:
        """``wanted`` capped."""
        return wanted if self.max_bytes is None else min(wanted, self.max_bytes)


def stream_config(spec: StreamSpec | DeadLetterStreamSpec, caps: Caps) -> js_api.StreamConfig:
    """The JetStream config of a stream spec (dead-letter streams use limits retention)."""
    replicas = caps.replicas(spec.replicas)
    if isinstance(spec, StreamSpec):
        # The stream also captures its durables' replays (ferry.replay.{STREAM}.{durable}),
        # and on a partitioned stream those of each partition (….{durable}.{k}).
        replays = [replay_wildcard(spec.name)]
        if spec.partitions > 1:
            replays.append(replay_wildcard(spec.name) + ".*")
        return js_api.StreamConfig(
            name=spec.name,
            subjects=[*spec.subjects, *replays],
            retention=js_api.RetentionPolicy(spec.retention),
            max_age=spec.max_age,
            max_bytes=caps.bytes(spec.max_bytes),
            max_msg_size=spec.max_msg_size,
            storage=js_api.StorageType(spec.storage),
            num_replicas=replicas,
            duplicate_window=spec.duplicate_window,
            discard=js_api.DiscardPolicy(spec.discard),
            # The outbox-publisher sends claimed batches as atomic batches (nats-server
            # 2.12+): one stored write per batch, not one fsync per event.
            allow_atomic=True,
        )
    return js_api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=js_api.RetentionPolicy.LIMITS,
        max_age=spec.max_age,
        max_bytes=caps.bytes(spec.max_bytes),
        storage=js_api.StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=spec.duplicate_window,
        discard=js_api.DiscardPolicy.OLD,
    )


#: Durable name of the dlq-router on a topology's advisory stream.
ROUTER_DURABLE = "dlq_router"


def advisory_stream_config(topology: Topology, caps: Caps) -> js_api.StreamConfig:
    """The stream that captures MAX_DELIVERIES / MSG_TERMINATED advisories of every durable.

    Advisories are core NATS messages: without this stream they vanish when no dlq-router
    happens to be listening.
    """
    subjects = [
        subject
        for name, durable in sorted(topology.durables.items())
        for plan in topology.consumers(name)
        for subject in advisory_subjects(durable.stream, plan.name)
    ]
    return js_api.StreamConfig(
        name=topology.advisory_stream,
        subjects=subjects,
        retention=js_api.RetentionPolicy.LIMITS,
        max_age=30 * 86400.0,
        max_bytes=caps.bytes(1000**3),
        storage=js_api.StorageType.FILE,
        num_replicas=caps.replicas(3),
        duplicate_window=120.0,
        discard=js_api.DiscardPolicy.OLD,
    )


def router_consumer_config() -> js_api.ConsumerConfig:
    """The dlq-router's durable on the advisory stream (naks carry explicit delays)."""
    return js_api.ConsumerConfig(
        name=ROUTER_DURABLE,
        durable_name=ROUTER_DURABLE,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=60.0,
        # Finite, but long enough to outlast a day of database outage at 60 s per nak.
        max_deliver=2000,
        max_ack_pending=200,
        replay_policy=js_api.ReplayPolicy.INSTANT,
    )


def consumer_config(
    name: str, spec: DurableSpec, plan: ConsumerPlan | None = None
) -> js_api.ConsumerConfig:
    """The JetStream config of a durable's consumer (``plan``: one of its partitions).

    No ``backoff`` list: JetStream applies it to ack timeouts only, and would shorten
    the first ack_wait to its first step; retries carry explicit nak delays instead.
    """
    # Its own replay subject too: replays reach the durable that failed and no other.
    filters = [*spec.filter_subjects, replay_subject(spec.stream, name)]
    metadata = None
    if plan is not None:
        name, filters = plan.name, list(plan.filters)
        if plan.partition is not None:
            metadata = {
                META_PARTITION: str(plan.partition),
                META_PARTITIONS: str(plan.partitions),
            }
    return js_api.ConsumerConfig(
        name=name,
        durable_name=name,
        metadata=metadata,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        replay_policy=js_api.ReplayPolicy.INSTANT,
    )
