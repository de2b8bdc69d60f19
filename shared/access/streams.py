"""Provision streams and consumers from the topology, idempotently, reporting drift.

Create what is missing; compare what exists with what the topology says; apply a
change the server accepts, refuse loudly one it cannot take (storage type, ack
policy), and never leave a difference unreported. ``check`` mode changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from shared.contracts.topology import DeadLetterStreamSpec, DurableSpec, StreamSpec, Topology
from shared.domain.subjects import (
    advisory_subjects,
    replay_subject,
    replay_wildcard,
)

Action = Literal["created", "unchanged", "updated", "drift", "refused", "missing"]

#: Stream fields the server will not change in place.
IMMUTABLE_STREAM_FIELDS = frozenset({"storage", "retention"})
#: Consumer fields the server will not change in place.
IMMUTABLE_CONSUMER_FIELDS = frozenset({"ack_policy", "deliver_policy"})


@dataclass
class Change:
    """What provisioning found or did for one stream or consumer."""

    kind: Literal["stream", "consumer"]
    name: str
    action: Action
    diffs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    error: str | None = None

    def describe(self) -> str:
        """One human line: ``consumer sea__from_vibespro: updated (ack_wait 60 -> 120)``."""
        text = f"{self.kind} {self.name}: {self.action}"
        if self.diffs:
            text += (
                " (" + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in self.diffs.items()) + ")"
            )
        if self.error:
            text += f": {self.error}"
        return text


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
        return js_api.StreamConfig(
            name=spec.name,
            # The stream also captures its durables' replays (ferry.replay.{STREAM}.{durable}).
            subjects=[*spec.subjects, replay_wildcard(spec.name)],
            retention=js_api.RetentionPolicy(spec.retention),
            max_age=spec.max_age,
            max_bytes=caps.bytes(spec.max_bytes),
            max_msg_size=spec.max_msg_size,
            storage=js_api.StorageType(spec.storage),
            num_replicas=replicas,
            duplicate_window=spec.duplicate_window,
            discard=js_api.DiscardPolicy(spec.discard),
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
        for subject in advisory_subjects(durable.stream, name)
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


def consumer_config(name: str, spec: DurableSpec) -> js_api.ConsumerConfig:
    """The JetStream config of a durable.

    No ``backoff`` list: JetStream applies it to ack timeouts only, and would shorten
    the first ack_wait to its first step; retries carry explicit nak delays instead.
    """
    # Its own replay subject too: replays reach the durable that failed and no other.
    filters = [*spec.filter_subjects, replay_subject(spec.stream, name)]
    return js_api.ConsumerConfig(
        name=name,
        durable_name=name,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        replay_policy=js_api.ReplayPolicy.INSTANT,
    )


def _norm(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 3)
    if hasattr(value, "value"):  # enums
        return value.value
    if isinstance(value, list):
        return sorted(value)
    return value


def _diff(want: Any, have: Any, fields: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    diffs = {}
    for name in fields:
        wanted, actual = _norm(getattr(want, name)), _norm(getattr(have, name))
        if wanted != actual:
            diffs[name] = (actual, wanted)
    return diffs


_STREAM_FIELDS = (
    "subjects",
    "retention",
    "max_age",
    "max_bytes",
    "max_msg_size",
    "storage",
    "num_replicas",
    "duplicate_window",
    "discard",
)
_CONSUMER_FIELDS = (
    "deliver_policy",
    "ack_policy",
    "ack_wait",
    "max_deliver",
    "max_ack_pending",
    "filter_subject",
    "filter_subjects",
)


async def provision_stream(
    js: JetStreamContext, want: js_api.StreamConfig, *, apply: bool
) -> Change:
    """Create, compare or update one stream."""
    assert want.name is not None
    try:
        info = await js.stream_info(want.name)
    except NotFoundError:
        if not apply:
            return Change("stream", want.name, "missing")
        return await _create("stream", want.name, lambda: js.add_stream(want))
    diffs = _diff(want, info.config, _STREAM_FIELDS)
    return await _settle(
        Change("stream", want.name, "unchanged", diffs),
        immutable=IMMUTABLE_STREAM_FIELDS,
        apply=apply,
        update=lambda: js.update_stream(want),
    )


async def provision_consumer(
    js: JetStreamContext, stream: str, want: js_api.ConsumerConfig, *, apply: bool
) -> Change:
    """Create, compare or update one durable consumer."""
    assert want.durable_name is not None
    try:
        info = await js.consumer_info(stream, want.durable_name)
    except NotFoundError:
        if not apply:
            return Change("consumer", want.durable_name, "missing")
        return await _create("consumer", want.durable_name, lambda: js.add_consumer(stream, want))
    diffs = _diff(want, info.config, _CONSUMER_FIELDS)
    return await _settle(
        Change("consumer", want.durable_name, "unchanged", diffs),
        immutable=IMMUTABLE_CONSUMER_FIELDS,
        apply=apply,
        update=lambda: js.add_consumer(stream, want),
    )


async def _create(kind: Literal["stream", "consumer"], name: str, create: Any) -> Change:
    try:
        await create()
    except APIError as exc:
        return Change(
            kind, name, "refused", error=f"server refused to create it: {exc.description or exc}"
        )
    return Change(kind, name, "created")


async def _settle(change: Change, *, immutable: frozenset[str], apply: bool, update: Any) -> Change:
    if not change.diffs:
        return change
    blocked = sorted(immutable & change.diffs.keys())
    if blocked:
        change.action = "refused"
        change.error = f"{', '.join(blocked)} cannot change in place; recreate it deliberately"
        return change
    if not apply:
        change.action = "drift"
        return change
    try:
        await update()
    except APIError as exc:
        change.action = "refused"
        change.error = f"server refused the update: {exc.description or exc}"
        return change
    change.action = "updated"
    return change


async def provision(
    js: JetStreamContext, topology: Topology, *, apply: bool = True, caps: Caps | None = None
) -> list[Change]:
    """Provision every stream, dead-letter stream and durable of ``topology``."""
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
    for name, durable in topology.durables.items():
        config = consumer_config(name, durable)
        changes.append(await provision_consumer(js, durable.stream, config, apply=apply))
    assert advisories.name is not None
    changes.append(
        await provision_consumer(js, advisories.name, router_consumer_config(), apply=apply)
    )
    return changes


def is_clean(changes: list[Change]) -> bool:
    """True when nothing was refused and nothing is left drifting or missing."""
    return all(c.action in ("created", "unchanged", "updated") for c in changes)
