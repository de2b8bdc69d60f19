"""Provision streams and consumers from the topology, idempotently, reporting drift.

Create what is missing; compare what exists with what the topology says; apply a
change the server accepts, refuse loudly one it cannot take (storage type, ack
policy), and never leave a difference unreported. ``check`` mode changes nothing.

A durable declared ``ordering: key`` on a stream with ``partitions: N > 1`` has one
consumer per partition (``{durable}_p{k}``, see :meth:`Topology.consumers`), each recording
its partition and N in its metadata. Changing N (or the ordering) is a repartition: the
keys move between partitions, so it is only applied once every consumer of the old layout
is drained (0 pending, 0 unacked) — otherwise it is refused, naming the procedure, unless
``repartition=True`` (``ferry provision --repartition``) — and the new consumers start at
the first message an old one had not acknowledged. Consumers of the old layout beyond
the new ones are reported ``stale`` and deleted only with ``repartition=True``.

The pieces live in sibling modules: :mod:`.streams_config` builds the JetStream configs
(and :class:`Caps`), :mod:`.streams_apply` creates, compares or updates one stream or
consumer (and defines :class:`Change`), :mod:`.streams_partitions` provisions a durable's
consumers and repartitions it. This module runs them over a whole topology.
"""

from __future__ import annotations

from nats.js import JetStreamContext

from shared.access.streams_apply import IMMUTABLE_CONSUMER_FIELDS as IMMUTABLE_CONSUMER_FIELDS
from shared.access.streams_apply import IMMUTABLE_STREAM_FIELDS as IMMUTABLE_STREAM_FIELDS
from shared.access.streams_apply import Action as Action
from shared.access.streams_apply import Change as Change
from shared.access.streams_apply import provision_consumer as provision_consumer
from shared.access.streams_apply import provision_stream as provision_stream
from shared.access.streams_config import META_PARTITION as META_PARTITION
from shared.access.streams_config import META_PARTITIONS as META_PARTITIONS
from shared.access.streams_config import ROUTER_DURABLE as ROUTER_DURABLE
from shared.access.streams_config import Caps as Caps
from shared.access.streams_config import advisory_stream_config as advisory_stream_config
from shared.access.streams_config import consumer_config as consumer_config
from shared.access.streams_config import router_consumer_config as router_consumer_config
from shared.access.streams_config import stream_config as stream_config
from shared.access.streams_partitions import REPARTITION_PROCEDURE as REPARTITION_PROCEDURE
from shared.access.streams_partitions import provision_durable as provision_durable
from shared.contracts.topology import DeadLetterStreamSpec, StreamSpec, Topology


async def provision(
    js: JetStreamContext,
    topology: Topology,
    *,
    apply: bool = True,
    caps: Caps | None = None,
    repartition: bool = False,
) -> list[Change]:
    """Provision every stream, dead-letter stream and durable of ``topology``.

    ``repartition``: change a durable's partition layout even while its consumers hold
    messages, and delete the consumers of an old layout (see the module doc).
    """
    caps = caps or Caps()
    changes = []
    specs: list[StreamSpec | DeadLetterStreamSpec] = [
        *topology.streams_by_name().values(),
        *topology.dead_letter_streams,
    ]
    for spec in specs:
        changes.append(await provision_stream(js, stream_config(spec, caps), apply=apply))
    advisories = advisory_stream_config(topology, caps)
    changes.append(await provision_stream(js, advisories, apply=apply))
    for name in topology.durables:
        changes += await provision_durable(js, topology, name, apply=apply, repartition=repartition)
    assert advisories.name is not None
    changes.append(
        await provision_consumer(js, advisories.name, router_consumer_config(), apply=apply)
    )
    return changes


def is_clean(changes: list[Change]) -> bool:
    """True when nothing was refused and nothing is left drifting, missing or stale."""
    return all(c.action in ("created", "unchanged", "updated", "deleted") for c in changes)
