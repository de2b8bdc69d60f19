"""The parts of a topology: a context and its stream, a durable and its handler, replay
limits, throttle, events and dead-letter streams, each a pydantic model that validates
itself (:class:`shared.contracts.topology.Topology` checks the references between them).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from shared.contracts.topology_subjects import covers
from shared.domain.durations import parse_duration, parse_size
from shared.domain.ordering import MAX_PARTITIONS, PartitionFilterError, all_partitions_filter
from shared.domain.subjects import NAMESPACE, SNAKE_CASE
from shared.domain.throttle import MAX_BURST, Limit, parse_rate

Seconds = Annotated[float, BeforeValidator(parse_duration)]
Bytes = Annotated[int, BeforeValidator(parse_size)]
_STREAM_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamSpec(Model):
    """A JetStream stream owned by one context (REQ-055, SDS-047 §10)."""

    name: str
    subjects: list[str] = Field(min_length=1)
    retention: Literal["limits", "interest", "workqueue"] = "limits"
    max_age: Seconds = 7 * 86400.0
    max_bytes: Bytes = 10 * 1000**3
    max_msg_size: Bytes = 1024 * 1024
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=3, ge=1, le=5)
    #: Window in which a re-published Nats-Msg-Id is dropped as a duplicate.
    duplicate_window: Seconds = 120.0
    discard: Literal["old", "new"] = "old"
    #: Partitions of the stream's subjects (``{subject}.{partition}``, the partition of the
    #: event's ordering key): each partition of an ``ordering: key`` durable is consumed by
    #: one replica at a time. 1 = no partition token.
    partitions: int = Field(default=1, ge=1, le=MAX_PARTITIONS)

    @model_validator(mode="after")
    def _check_name(self) -> StreamSpec:
        if not _STREAM_NAME.match(self.name):
            raise ValueError(f"stream name {self.name!r} must be UPPER_SNAKE (no dots)")
        if self.duplicate_window > self.max_age:
            raise ValueError("duplicate_window cannot exceed max_age")
        return self


class ContextSpec(Model):
    """A bounded context: its database, its subject namespace, its stream."""

    database: str
    #: Events are published on ``{namespace}.{event_type}.v{n}``.
    namespace: str
    stream: StreamSpec | None = None
    #: Where this context's dead letters go (``{context}.dlq`` → ``sea.dlq.<durable>``).
    dead_letter_subject: str
    #: How long the inbox of this context keeps a row with a final outcome. Must outlast
    #: every way a copy can still arrive (stream max_age, redeliveries, replays), or a late
    #: copy is processed twice; ``ferry lint`` checks it (rule ``inbox-retention``).
    inbox_retention: Seconds = 35 * 86400.0
    #: How long the outbox keeps a row once it is published (``ferry purge``); an
    #: unpublished row is kept whatever its age.
    outbox_retention: Seconds = 7 * 86400.0
    #: How long the handler SDK's claims (``handler_applied``) and effects ledger
    #: (``handler_calls``) in this context's database are kept (``ferry purge``). A claim
    #: must outlast every way a copy can still arrive, like the inbox row; ``ferry lint``
    #: checks it (rule ``claims-retention``).
    claims_retention: Seconds = 35 * 86400.0
    #: How long the audit rows in this context's database are kept (``ferry purge``):
    #: ``outbox_actions``, ``dead_letter_actions``, ``dead_letter_edits``,
    #: ``parked_actions``, ``throttle_actions``, ``pause_actions``, ``durable_rewinds``,
    #: ``replay_jobs``. Rows of unfinished work (an open dead letter, an unpublished
    #: outbox row, a running rewind or replay job, the throttle or pause in force) are
    #: kept whatever their age.
    audit_retention: Seconds = 400 * 86400.0
    #: How long this context's outbox-publisher, woken by a commit, may wait to gather the
    #: commits behind it into one claim (FERRY_PUBLISHER_LINGER, which wins when set):
    #: for a context whose events can spare it, claims at a moderate rate grow large
    #: enough for atomic batches, which costs less CPU per event. None: the setting's.
    publisher_linger: Seconds | None = Field(default=None, ge=0, le=1.0)

    @model_validator(mode="after")
    def _check_namespace(self) -> ContextSpec:
        if not NAMESPACE.match(self.namespace):
            raise ValueError(f"namespace {self.namespace!r} must be dotted lower-case")
        if self.stream is None:
            return self
        partitioned = self.stream.partitions > 1
        sample = self.namespace + (".x.v1.0" if partitioned else ".x.v1")
        if not any(covers(s, sample) for s in self.stream.subjects):
            raise ValueError(f"stream {self.stream.name} does not capture {self.namespace}.>")
        if partitioned:
            for index, pattern in enumerate(self.stream.subjects):
                _check_partitioned_subject(self, index, pattern)
        return self


def _check_partitioned_subject(ctx: ContextSpec, index: int, pattern: str) -> None:
    """A partitioned stream's subject must capture the partition token."""
    assert ctx.stream is not None
    field = f"stream.subjects[{index}]"
    try:
        wanted = all_partitions_filter(pattern, ctx.namespace)
    except PartitionFilterError as exc:
        raise ValueError(
            f"{field}: {exc} (stream {ctx.stream.name} has partitions: {ctx.stream.partitions})"
        ) from None
    if wanted != pattern:
        raise ValueError(
            f"{field}: {pattern!r} does not capture the partition token that stream "
            f"{ctx.stream.name} (partitions: {ctx.stream.partitions}) adds to every subject: "
            f"write {wanted!r} or {ctx.namespace}.>"
        )


class HandlerSpec(Model):
    """The handler service a durable dispatches to."""

    url: str
    timeout: Seconds = 10.0
    #: Events per handler call: 1 (the default) is the per-message contract; N ≥ 2 sends
    #: up to N events of one fetch in one signed POST and reads one result per event
    #: (docs/reference/handler-contract.md, "Batch calls"). Refused with ordering: key.
    batch: int = Field(default=1, ge=1, le=1000)


class ReplayLimits(Model):
    """How the dlq-replayer replays a durable's dead letters under the automatic policy.

    Each entry waits a random delay in ``[0, min(max_delay, base_delay * 2**n))`` before its
    n-th replay (exponential back-off with full jitter, REQ-059); after ``max_attempts``
    failed replays it is parked for an operator. ``rate`` caps replays per second for the
    durable, so a replay storm cannot swamp a handler that is just recovering.
    """

    base_delay: Seconds = 5.0
    max_delay: Seconds = 600.0
    max_attempts: int = Field(default=5, ge=1)
    rate: float = Field(default=20.0, gt=0)


Rate = Annotated[float, BeforeValidator(parse_rate)]


class ThrottleSpec(Model):
    """A processing rate limit (INFRA-005 §7.3): at most ``rate`` messages (``20/s``,
    ``300/m``, ``1/h``) are fetched for the handler per second, with bursts of up to
    ``burst`` (default: one second's worth), for the whole durable: its live consumer
    processes (replicas) share it."""

    rate: Rate
    burst: int | None = Field(default=None, ge=1, le=MAX_BURST)

    def limit(self) -> Limit:
        """The rate and burst in force."""
        return Limit.of(self.rate, self.burst)


class BreakerSpec(Model):
    """A durable's circuit breaker (issue 45): after ``failures`` handler calls in a row
    failed (a timeout, no connection, 5xx or 429) within ``window``, the consumer stops
    calling the handler and holds what it has (heart-beating it: no delivery spent) while
    one call every ``probe_every`` tries the handler; the first that succeeds closes it."""

    enabled: bool = True
    failures: int = Field(default=5, ge=1, le=1000)
    window: Seconds = Field(default=10.0, gt=0)
    probe_every: Seconds = Field(default=5.0, gt=0)


class DurableSpec(Model):
    """A pull consumer: one inbox-consumer process group per durable."""

    stream: str
    #: The context whose database holds this durable's inbox.
    target: str
    filter_subjects: list[str] = Field(min_length=1)
    ack_wait: Seconds = 120.0
    max_deliver: int = Field(default=20, ge=1)
    max_ack_pending: int = Field(default=50, ge=1)
    #: Delay before redelivery after the n-th failed attempt (naks carry it explicitly).
    backoff: list[Seconds] = Field(default_factory=lambda: [1.0, 5.0, 30.0, 120.0, 600.0])
    batch_size: int = Field(default=50, ge=1, le=1000)
    handler: HandlerSpec
    dead_letter_subject: str
    #: automatic: the dlq-replayer replays retryable dead letters (REQ-059); operator: only
    #: an operator replays (INFRA-005 §4.3).
    replay: Literal["automatic", "operator"] = "automatic"
    replay_limits: ReplayLimits = Field(default_factory=ReplayLimits)
    #: Whether the consumer sends ``in_progress`` every ack_wait/3 while the handler runs;
    #: without heartbeats the handler timeout must stay below ack_wait (``ferry lint``).
    heartbeats: bool = True
    #: ``key``: the events of one ordering key reach the handler one at a time, in stream
    #: order, and a failing event holds back only its key's later events (parked in the
    #: inbox database). ``none``: any order, as parallel as the concurrency allows.
    ordering: Literal["none", "key"] = "none"
    #: With ``ordering: key``, what a dead letter does to its key's later events: ``hold``
    #: parks them until an operator replays or discards it; ``skip`` lets them go on and
    #: records on the dead letter that order was broken after it.
    on_dead_letter: Literal["hold", "skip"] = "hold"
    #: ``high``: a critical lane (INFRA-005 §7: "H publish: low frequency but high
    #: criticality"): its own alerts fire on the first dead letter and on any lag, the
    #: KPI report and the console list it first, and it may not be throttled.
    criticality: Literal["normal", "high"] = "normal"
    #: A processing rate limit for a non-critical lane (INFRA-005 §7.3); None: none. An
    #: operator override (``ferry durable throttle``) replaces it while it is set.
    throttle: ThrottleSpec | None = None
    #: Stop calling a handler that is down, hold what is in hand, probe (on by default).
    circuit_breaker: BreakerSpec = Field(default_factory=BreakerSpec)

    @model_validator(mode="after")
    def _check(self) -> DurableSpec:
        if not self.backoff:
            raise ValueError("backoff needs at least one delay")
        if self.max_ack_pending < self.batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} exceeds max_ack_pending {self.max_ack_pending}: "
                "fetches would stall"
            )
        return self


class EventSpec(Model):
    """One published event version, as the deployment sees it.

    Declared in ``manifests/<topology>/<context>.yaml`` and compiled into the registry
    file (:mod:`shared.contracts.events`); :func:`load_topology` attaches them, working out
    ``handled_by`` from this topology's durables.
    """

    #: The producing context.
    context: str
    type: str
    version: int = Field(ge=1)
    #: JSON Schema (draft 2020-12) of the payload.
    payload_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    #: Durables that deliver it to a context that handles it.
    handled_by: list[str] = Field(default_factory=list)
    #: Handling context → handler reference (``module:function``).
    handlers: dict[str, str] = Field(default_factory=dict)
    #: The manifest file that declares it (named in error messages).
    manifest: str = ""
    #: What the event means, as its manifest describes it.
    description: str = ""
    #: ``sha256:`` fingerprint of the schema's constraints (locked per version).
    fingerprint: str = ""
    #: The payload field (dotted path) whose value is the ordering key; None: the
    #: aggregate (``aggregate_type/aggregate_id``).
    ordering_key: str | None = None

    @property
    def name(self) -> str:
        """``type.vN``."""
        return f"{self.type}.v{self.version}"

    @model_validator(mode="after")
    def _check(self) -> EventSpec:
        if not SNAKE_CASE.match(self.type):
            raise ValueError(f"event type {self.type!r} must be snake_case")
        return self


class DeadLetterStreamSpec(Model):
    """A dead-letter stream (limits retention so records stay inspectable)."""

    name: str
    subjects: list[str] = Field(min_length=1)
    max_age: Seconds = 30 * 86400.0
    max_bytes: Bytes = 10 * 1000**3
    replicas: int = Field(default=3, ge=1, le=5)
    #: Dead letters are few, so their duplicate window can be long: a record re-published
    #: after a crash (same ``durable:message_id[:generation]`` id) is dropped for a day.
    duplicate_window: Seconds = 86400.0
    #: Only limits retention keeps records inspectable after a consumer has read them.
    retention: Literal["limits"] = "limits"
