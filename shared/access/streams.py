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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from shared.contracts.topology import (
    ConsumerPlan,
    DeadLetterStreamSpec,
    DurableSpec,
    StreamSpec,
    Topology,
)
from shared.domain.ordering import durable_of_consumer
from shared.domain.subjects import (
    advisory_subjects,
    replay_subject,
    replay_wildcard,
)

Action = Literal[
    "created", "unchanged", "updated", "drift", "refused", "missing", "stale", "deleted"
]
#: Consumer metadata keys provisioning writes on a partition's consumer.
META_PARTITION = "ferry.partition"
META_PARTITIONS = "ferry.partitions"
#: What the operator does before a partition count changes (named in the refusal).
REPARTITION_PROCEDURE = (
    "stop the publishers of the stream (or let them drain), wait until every consumer of "
    "the durable has 0 pending and 0 unacked messages and its key has no parked messages, "
    "then run `ferry provision --repartition` and restart the consumers (docs: Ordering)"
)

#: Stream fields the server will not change in place.
IMMUTABLE_STREAM_FIELDS = frozenset({"storage", "retention"})
#: Consumer fields the server will not change in place.
IMMUTABLE_CONSUMER_FIELDS = frozenset({"ack_policy", "deliver_policy"})


@dataclass
class Change:
    """What provisioning found or did for one stream or consumer."""

    #: ``durable``: a change of a durable's partition layout (its consumers follow).
    kind: Literal["stream", "consumer", "durable"]
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
    "allow_atomic",
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


def _ferry_metadata(config: js_api.ConsumerConfig) -> dict[str, str]:
    """The consumer metadata Ferry writes (the server adds keys of its own)."""
    return {k: v for k, v in (config.metadata or {}).items() if k.startswith("ferry.")}


def _as_provisioned(
    want: js_api.ConsumerConfig, have: js_api.ConsumerConfig
) -> js_api.ConsumerConfig:
    """``want`` starting where ``have`` starts: a consumer a repartition created begins at
    the first message the old layout had not acknowledged, not at the stream's start,
    and that start can never change."""
    if (
        _norm(want.deliver_policy) == js_api.DeliverPolicy.ALL.value
        and _norm(have.deliver_policy) == js_api.DeliverPolicy.BY_START_SEQUENCE.value
    ):
        return replace(
            want,
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=have.opt_start_seq,
        )
    return want


async def provision_consumer(
    js: JetStreamContext, stream: str, want: js_api.ConsumerConfig, *, apply: bool
) -> Change:
    """Create, compare or update one durable consumer."""
    name = want.durable_name
    assert name is not None
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        if not apply:
            return Change("consumer", name, "missing")
        return await _create("consumer", name, lambda: js.add_consumer(stream, want))
    want = _as_provisioned(want, info.config)
    diffs = _diff(want, info.config, _CONSUMER_FIELDS)
    wanted_meta, have_meta = _ferry_metadata(want), _ferry_metadata(info.config)
    if wanted_meta != have_meta:
        diffs["metadata"] = (have_meta, wanted_meta)
        want = replace(want, metadata={**(info.config.metadata or {}), **wanted_meta})
    return await _settle(
        Change("consumer", name, "unchanged", diffs),
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


async def _consumers_of(js: JetStreamContext, stream: str, durable: str) -> list[Any]:
    """The consumers on ``stream`` that belong to ``durable`` (itself, ``{durable}_p{k}``)."""
    found: list[Any] = []
    while True:
        page = await js.consumers_info(stream, offset=len(found))
        found += page
        if not page:
            break
    return [c for c in found if durable_of_consumer(c.name, {durable}) == durable]


def _recorded_partitions(info: Any, durable: str) -> int | None:
    """The partition count a consumer was provisioned for (None: not Ferry's layout)."""
    recorded = (info.config.metadata or {}).get(META_PARTITIONS)
    if recorded is not None:
        return int(recorded) if str(recorded).isdigit() else None
    return 1 if info.name == durable else None


def _recorded_partition(info: Any) -> int | None:
    recorded = (info.config.metadata or {}).get(META_PARTITION)
    return int(recorded) if recorded is not None and str(recorded).isdigit() else None


def _waiting(info: Any) -> tuple[int, int]:
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def provision_durable(
    js: JetStreamContext, topology: Topology, name: str, *, apply: bool, repartition: bool
) -> list[Change]:
    """Provision the consumers of one durable, repartitioning it when its layout changed."""
    spec = topology.durable(name)
    plans = topology.consumers(name)
    wanted = {plan.name: plan for plan in plans}
    count = len(plans)
    try:
        mine = await _consumers_of(js, spec.stream, name)
    except NotFoundError:  # the stream is missing (check mode): every consumer is too
        mine = []
    old = [c for c in mine if c.name not in wanted or _recorded_partitions(c, name) != count]
    stale = [c for c in old if c.name not in wanted]
    reshaped = {c.name for c in old if c.name in wanted}
    missing = [p for p in plans if p.name not in {c.name for c in mine}]
    changes: list[Change] = []
    if old and (reshaped or missing):
        moved = await _repartition(
            js,
            spec,
            name,
            plans,
            old,
            reshaped,
            stream_partitions=topology.stream_of(name).partitions,
            apply=apply,
            forced=repartition,
        )
        if moved is not None:
            return [moved, *[await _stale(js, spec.stream, c, apply=False) for c in stale]]
        changes.append(Change("durable", name, "updated", _layout_diff(old, name, count)))
    for plan in plans:
        config = consumer_config(name, spec, plan)
        if plan.name in reshaped or (old and plan in missing):
            config = replace(
                config,
                deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=_start_after(old),
            )
        changes.append(await provision_consumer(js, spec.stream, config, apply=apply))
    for info in stale:
        changes.append(await _stale(js, spec.stream, info, apply=apply and repartition))
    return changes


def _layout_diff(old: list[Any], durable: str, count: int) -> dict[str, tuple[Any, Any]]:
    """``{"partitions": (was, now)}``; ``was`` lists every count the old consumers had
    (``?``: not provisioned by Ferry's partitioning)."""
    was = sorted({_recorded_partitions(c, durable) or 0 for c in old})
    return {"partitions": ("/".join(str(n) if n else "?" for n in was), count)}


def _start_after(old: list[Any]) -> int:
    """The first stream sequence some consumer of the old layout had not acknowledged."""
    floors = [int(c.ack_floor.stream_seq) if c.ack_floor else 0 for c in old]
    return min(floors, default=0) + 1


async def _repartition(
    js: JetStreamContext,
    spec: DurableSpec,
    name: str,
    plans: list[ConsumerPlan],
    old: list[Any],
    reshaped: set[str],
    *,
    stream_partitions: int,
    apply: bool,
    forced: bool,
) -> Change | None:
    """Check (and, applying, prepare) a change of ``name``'s partition layout; a Change
    when it stops there (refused, or only reported), None when its consumers go ahead."""
    diffs = _layout_diff(old, name, len(plans))
    busy = [(c.name, *_waiting(c)) for c in old if any(_waiting(c))]
    # Partition tokens the stream's subjects carry from now on: a message waiting on a
    # higher one would reach no consumer of the new layout.
    tokens = max(plans[0].partitions, stream_partitions)
    dropped = [
        (c.name, *_waiting(c))
        for c in old
        if any(_waiting(c)) and (_recorded_partition(c) or 0) >= tokens
    ]
    if dropped:
        held = ", ".join(f"{n} ({p} pending, {u} unacked)" for n, p, u in sorted(dropped))
        return Change(
            "durable",
            name,
            "refused",
            diffs,
            error=f"{held} still hold messages whose partition token the new layout does "
            "not read: no consumer would ever deliver them, --repartition or not; "
            + REPARTITION_PROCEDURE,
        )
    if busy and not forced:
        held = ", ".join(f"{n} ({p} pending, {u} unacked)" for n, p, u in sorted(busy))
        return Change(
            "durable",
            name,
            "refused",
            diffs,
            error=f"the partition layout changes while {held} still hold messages; "
            + REPARTITION_PROCEDURE,
        )
    if not apply:
        return Change("durable", name, "drift", diffs)
    for info in old:
        if info.name in reshaped:  # its start and meaning change: recreated below
            await js.delete_consumer(spec.stream, info.name)
    return None


async def _stale(js: JetStreamContext, stream: str, info: Any, *, apply: bool) -> Change:
    """A consumer of an old partition layout: reported, deleted only on a repartition."""
    pending, unacked = _waiting(info)
    if apply:
        await js.delete_consumer(stream, info.name)
        return Change("consumer", info.name, "deleted")
    return Change(
        "consumer",
        info.name,
        "stale",
        error=f"left from an earlier partition layout ({pending} pending, {unacked} unacked); "
        "`ferry provision --repartition` deletes it",
    )


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
