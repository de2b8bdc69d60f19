"""The topology: every deployment-specific fact about streams, durables and events.

A topology file (YAML) is validated by these pydantic models. Errors name the file,
the field path and the reason, e.g.::

    topologies/sea-vibespro.yaml: durables.sea__from_vibespro.max_deliver: must be >= 1
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from shared.domain.durations import parse_duration, parse_size
from shared.domain.errors import ConfigurationError
from shared.domain.ordering import (
    MAX_PARTITIONS,
    PartitionFilterError,
    all_partitions_filter,
    consumer_name,
    ordering_key,
    partition_filters,
    partition_of,
    partition_replay_subject,
)
from shared.domain.subjects import NAMESPACE, SNAKE_CASE, replay_subject
from shared.domain.throttle import MAX_BURST, Limit, parse_rate

Seconds = Annotated[float, BeforeValidator(parse_duration)]
Bytes = Annotated[int, BeforeValidator(parse_size)]
_STREAM_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_DURABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamSpec(_Model):
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


class ContextSpec(_Model):
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
        if not any(_covers(s, sample) for s in self.stream.subjects):
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


class HandlerSpec(_Model):
    """The handler service a durable dispatches to."""

    url: str
    timeout: Seconds = 10.0
    #: Events per handler call: 1 (the default) is the per-message contract; N ≥ 2 sends
    #: up to N events of one fetch in one signed POST and reads one result per event
    #: (docs/reference/handler-contract.md, "Batch calls"). Refused with ordering: key.
    batch: int = Field(default=1, ge=1, le=1000)


class ReplayLimits(_Model):
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


class ThrottleSpec(_Model):
    """A processing rate limit (INFRA-005 §7.3): at most ``rate`` messages (``20/s``,
    ``300/m``, ``1/h``) are fetched for the handler per second, with bursts of up to
    ``burst`` (default: one second's worth), for the whole durable: its live consumer
    processes (replicas) share it."""

    rate: Rate
    burst: int | None = Field(default=None, ge=1, le=MAX_BURST)

    def limit(self) -> Limit:
        """The rate and burst in force."""
        return Limit.of(self.rate, self.burst)


class DurableSpec(_Model):
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


class EventSpec(_Model):
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


class DeadLetterStreamSpec(_Model):
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


class Topology(_Model):
    """A whole deployment: contexts, durables, dead-letter streams, events."""

    name: str
    contexts: dict[str, ContextSpec]
    durables: dict[str, DurableSpec]
    dead_letter_streams: list[DeadLetterStreamSpec] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_references(self) -> Topology:
        streams = self.streams_by_name()
        for name, durable in self.durables.items():
            _check_durable(name, durable, streams, self)
        for event in self.events:
            if event.context not in self.contexts:
                raise ValueError(f"event {event.type}.v{event.version}: unknown context")
            for durable_name in event.handled_by:
                if durable_name not in self.durables:
                    raise ValueError(
                        f"event {event.type}.v{event.version}: unknown durable {durable_name!r}"
                    )
        return self

    @property
    def advisory_stream(self) -> str:
        """Name of the stream capturing this topology's delivery advisories."""
        return re.sub(r"[^A-Z0-9]+", "_", self.name.upper()).strip("_") + "_ADVISORIES"

    def streams_by_name(self) -> dict[str, StreamSpec]:
        """Every context stream, keyed by stream name."""
        return {c.stream.name: c.stream for c in self.contexts.values() if c.stream}

    def context_of_stream(self, stream: str) -> str:
        """Name of the context that owns ``stream``."""
        for name, ctx in self.contexts.items():
            if ctx.stream and ctx.stream.name == stream:
                return name
        raise KeyError(stream)

    def context(self, name: str) -> ContextSpec:
        """The context called ``name``, or a :class:`ConfigurationError` listing the known ones."""
        try:
            return self.contexts[name]
        except KeyError:
            known = ", ".join(sorted(self.contexts))
            raise ConfigurationError(
                f"topology {self.name!r} has no context {name!r} (known: {known})"
            ) from None

    def durable(self, name: str) -> DurableSpec:
        """The durable called ``name``, or a :class:`ConfigurationError` listing the known ones."""
        try:
            return self.durables[name]
        except KeyError:
            known = ", ".join(sorted(self.durables))
            raise ConfigurationError(
                f"topology {self.name!r} has no durable {name!r} (known: {known})"
            ) from None

    def databases(self) -> list[str]:
        """Distinct database names, in a stable order."""
        return sorted({c.database for c in self.contexts.values()})

    def stream_of(self, durable: str) -> StreamSpec:
        """The stream ``durable`` reads."""
        return self.streams_by_name()[self.durable(durable).stream]

    def namespace_of_stream(self, stream: str) -> str:
        """The namespace of the context that owns ``stream``."""
        return self.contexts[self.context_of_stream(stream)].namespace

    def consumer_partitions(self, durable: str) -> int:
        """How many JetStream consumers ``durable`` has: its stream's partitions when it is
        declared ``ordering: key``, else 1 (one consumer reads every partition)."""
        spec = self.durable(durable)
        return self.stream_of(durable).partitions if spec.ordering == "key" else 1

    def consumers(self, durable: str) -> list[ConsumerPlan]:
        """The JetStream consumers of ``durable``: one per partition for an ``ordering: key``
        durable on a partitioned stream, else the durable itself."""
        spec = self.durable(durable)
        count = self.consumer_partitions(durable)
        replay = replay_subject(spec.stream, durable)
        if count == 1:
            return [
                ConsumerPlan(durable, durable, None, 1, (*spec.filter_subjects, replay), replay)
            ]
        namespace = self.namespace_of_stream(spec.stream)
        plans = []
        for k in range(count):
            own_replay = partition_replay_subject(replay, k)
            filters = (*partition_filters(spec.filter_subjects, namespace, k), own_replay)
            plans.append(
                ConsumerPlan(
                    durable, consumer_name(durable, k, count), k, count, filters, own_replay
                )
            )
        return plans

    def ordering_field(self, context: str, event_type: str, version: int) -> str | None:
        """The payload field an event of ``context`` is keyed by (None: its aggregate)."""
        for event in self.events:
            if (event.context, event.type, event.version) == (context, event_type, version):
                return event.ordering_key
        return None

    def replay_subject_for(self, durable: str, envelope: Mapping[str, Any]) -> str:
        """Where a replay of ``envelope`` (its JSON document) for ``durable`` is published:
        the durable's replay subject, with the partition of the event's ordering key when
        the durable has a consumer per partition — so the replay comes back through its
        key's partition. Raises :class:`OrderingKeyError` when the key cannot be read."""
        plans = self.consumers(durable)
        if len(plans) == 1:
            return plans[0].replay_subject
        context = self.context_of_stream(self.durable(durable).stream)
        event_type, version = envelope.get("event_type"), envelope.get("event_version")
        field = None
        if isinstance(event_type, str) and isinstance(version, int):
            field = self.ordering_field(context, event_type, version)
        key = ordering_key(envelope, field)
        return plans[partition_of(key, len(plans))].replay_subject

    def delivers(self, durable: str, subject: str) -> bool:
        """Whether ``durable``'s filters take events published on ``subject``
        (``{ns}.{type}.v{n}``, without a partition token)."""
        spec = self.durable(durable)
        stream = self.streams_by_name()[spec.stream]
        if stream.partitions == 1:
            return any(_covers(p, subject) for p in spec.filter_subjects)
        filters = self.consumers(durable)[0].filters
        return any(_covers(p, f"{subject}.0") for p in filters)


@dataclass(frozen=True, slots=True)
class ConsumerPlan:
    """One JetStream consumer of a durable (see :meth:`Topology.consumers`)."""

    durable: str
    #: The JetStream consumer's name: ``{durable}_p{k}``, or the durable itself.
    name: str
    #: The partition it reads; None: every partition (or the stream has one).
    partition: int | None
    #: How many consumers the durable has.
    partitions: int
    #: Its filter subjects: the durable's event filters (narrowed to the partition) and
    #: its replay subject.
    filters: tuple[str, ...]
    #: Where replays for it are published.
    replay_subject: str


def _check_durable(
    name: str, durable: DurableSpec, streams: dict[str, StreamSpec], topo: Topology
) -> None:
    if not _DURABLE_NAME.match(name):
        raise ValueError(f"durable {name!r} must be lower_snake")
    stream = streams.get(durable.stream)
    if stream is None:
        raise ValueError(f"durable {name}: unknown stream {durable.stream!r}")
    if durable.target not in topo.contexts:
        raise ValueError(f"durable {name}: unknown target context {durable.target!r}")
    for subject in durable.filter_subjects:
        if not any(_covers(pattern, subject) for pattern in stream.subjects):
            raise ValueError(
                f"durable {name}: filter {subject!r} is outside stream {stream.name}'s subjects"
            )
    if stream.partitions > 1:
        namespace = topo.contexts[topo.context_of_stream(stream.name)].namespace
        for index, subject in enumerate(durable.filter_subjects):
            _check_partitioned_filter(name, durable, stream, namespace, index, subject)


def _check_partitioned_filter(
    name: str, durable: DurableSpec, stream: StreamSpec, namespace: str, index: int, subject: str
) -> None:
    """A filter on a partitioned stream must be readable per partition (``ordering: key``:
    each partition's consumer narrows it) or match every partition (``ordering: none``)."""
    field = f"durables.{name}.filter_subjects[{index}]"
    has = f"stream {stream.name} has partitions: {stream.partitions}"
    try:
        wanted = all_partitions_filter(subject, namespace)
        if durable.ordering == "key":
            partition_filters([subject], namespace, 0)
    except PartitionFilterError as exc:
        raise ValueError(f"{field}: {exc} ({has})") from None
    if durable.ordering == "none" and wanted != subject:
        raise ValueError(
            f"{field}: {subject!r} matches no message: {has}, so every subject ends in a "
            f"partition token; an unordered durable reads every partition with {wanted!r} "
            "(or declare ordering: key, whose consumers narrow the filter per partition)"
        )


def _covers(pattern: str, subject: str) -> bool:
    """Whether NATS wildcard ``pattern`` matches every subject ``subject`` matches."""
    p_tokens, s_tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(p_tokens):
        if token == ">":
            return len(s_tokens) > index
        if index >= len(s_tokens):
            return False
        if token not in ("*", s_tokens[index]):
            return False
    return len(p_tokens) == len(s_tokens)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match of a concrete ``subject`` against ``pattern``."""
    return _covers(pattern, subject)


def read_topology(path: Path | str) -> Topology:
    """Read and validate a topology file, without its events; errors name file and field.

    :func:`shared.contracts.loading.load_topology` adds the events from the
    registry (the registry imports this module, so this one cannot call it).
    """
    return _load_file(Path(path))


#: Most values a YAML file may expand to (aliases counted each time they are used): a
#: few aliased lists nested in one another otherwise expand past any memory.
MAX_YAML_VALUES = 100_000
#: Deepest nesting a YAML file may have (PyYAML composes recursively).
MAX_YAML_DEPTH = 100
#: Integers below 2**13000 (3,914 digits) print within Python's 4,300-digit limit.
_PRINTABLE_INT_BITS = 13_000


def load_yaml_mapping(path: Path, label: str, what: str) -> dict[str, Any]:
    """The YAML mapping in ``path``, or a :class:`ConfigurationError` starting ``label:``.

    Whatever the file holds (not UTF-8, not YAML, nested past ``MAX_YAML_DEPTH``, numbers
    past Python's 4,300-digit limit, an alias bomb), the answer is the mapping or that
    error, never another exception.
    """
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{label}: cannot read {what}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{label}: not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{label}: not valid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"{label}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    except ValueError as exc:  # the constructor's int(): a number of over 4,300 digits
        raise ConfigurationError(f"{label}: not valid YAML: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{label}: the top level must be a mapping")
    _check_expanse(raw, label)
    return raw


def _check_expanse(raw: dict[str, Any], label: str) -> None:
    """Refuse a document nested too deep or expanding to too many values (iteratively)."""
    stack: list[tuple[Any, int]] = [(raw, 1)]
    values = 0
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > MAX_YAML_VALUES:
            raise ConfigurationError(
                f"{label}: expands to more than {MAX_YAML_VALUES} values (aliases of aliases?)"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigurationError(f"{label}: nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(node, int) and node.bit_length() > _PRINTABLE_INT_BITS:
            # e.g. 0xfff… (hex has no digit limit): no error message could even print it.
            raise ConfigurationError(f"{label}: a number of over 4,000 digits")
        if isinstance(node, dict):
            stack.extend((item, depth + 1) for pair in node.items() for item in pair)
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)


def _load_file(path: Path) -> Topology:
    raw = load_yaml_mapping(path, str(path), "topology")
    if "events" in raw:
        raise ConfigurationError(
            f"{path}: events: events are declared in manifests/<topology>/<context>.yaml "
            "and compiled by `ferry registry generate`, not in the topology file"
        )
    try:
        return Topology.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(_describe(path, exc)) from None


def _describe(path: Path, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(f"{path}: {where}: {error['msg']}")
    return "\n".join(lines)
