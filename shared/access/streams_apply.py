"""Create, compare or update one stream or one consumer: the :class:`Change` provisioning
reports for each, the fields it compares, and those the server will not change in place."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

Action = Literal[
    "created", "unchanged", "updated", "drift", "refused", "missing", "stale", "deleted"
]

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
