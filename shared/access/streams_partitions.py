"""Provision one durable's consumers, and change its partition layout (a repartition):
what the consumers of the old layout recorded and still hold, the refusal, the start of
the new consumers, and the consumers of an old layout left stale."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from shared.access.streams_apply import Change, provision_consumer
from shared.access.streams_config import META_PARTITION, META_PARTITIONS, consumer_config
from shared.contracts.topology import ConsumerPlan, DurableSpec, Topology
from shared.domain.ordering import durable_of_consumer

#: What the operator does before a partition count changes (named in the refusal).
REPARTITION_PROCEDURE = (
    "stop the publishers of the stream (or let them drain), wait until every consumer of "
    "the durable has 0 pending and 0 unacked messages and its key has no parked messages, "
    "then run `ferry provision --repartition` and restart the consumers (docs: Ordering)"
)


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


def _refused(
    name: str, diffs: dict[str, tuple[Any, Any]], holders: list[tuple[str, int, int]], why: str
) -> Change:
    """The refused layout change of ``name``: ``why`` (``{}`` the ``holders``, each a
    consumer with its pending and unacked counts), then :data:`REPARTITION_PROCEDURE`."""
    held = ", ".join(f"{n} ({p} pending, {u} unacked)" for n, p, u in sorted(holders))
    return Change("durable", name, "refused", diffs, error=why.format(held) + REPARTITION_PROCEDURE)


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
        why = (
            "{} still hold messages whose partition token the new layout does not read: "
            "no consumer would ever deliver them, --repartition or not; "
        )
        return _refused(name, diffs, dropped, why)
    paused = sorted(c.name for c in old if getattr(c, "paused", False))
    if paused:  # its recreated consumers would start unpaused: the pause would end unseen
        return Change("durable", name, "refused", diffs, error=(
            f"{name} is paused ({', '.join(paused)}): a repartition recreates its "
            "consumers, which would run unpaused; resume it first (ferry durable resume), "
            "repartition, then pause it again"
        ))  # fmt: skip
    if busy and not forced:
        why = "the partition layout changes while {} still hold messages; "
        return _refused(name, diffs, busy, why)
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
