"""The topology: every deployment-specific fact about streams, durables and events.

A topology file (YAML) is validated by these pydantic models. Errors name the file,
the field path and the reason, e.g.::

    topologies/sea-vibespro.yaml: durables.sea__from_vibespro.max_deliver: must be >= 1

The parts of a topology file (contexts, streams, durables, handlers, events, dead-letter
streams) are modelled in :mod:`shared.contracts.topology_specs`, NATS subject wildcard
matching is in :mod:`shared.contracts.topology_subjects` and the bounded YAML reading in
:mod:`shared.contracts.topology_yaml`; this module holds the whole :class:`Topology`, with
the checks across its parts, and reads a topology file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError, model_validator

from shared.contracts.topology_specs import BreakerSpec as BreakerSpec
from shared.contracts.topology_specs import ContextSpec as ContextSpec
from shared.contracts.topology_specs import DeadLetterStreamSpec as DeadLetterStreamSpec
from shared.contracts.topology_specs import DurableSpec as DurableSpec
from shared.contracts.topology_specs import EventSpec as EventSpec
from shared.contracts.topology_specs import HandlerSpec as HandlerSpec
from shared.contracts.topology_specs import Model
from shared.contracts.topology_specs import ReplayLimits as ReplayLimits
from shared.contracts.topology_specs import StreamSpec as StreamSpec
from shared.contracts.topology_specs import ThrottleSpec as ThrottleSpec
from shared.contracts.topology_subjects import covers
from shared.contracts.topology_subjects import subject_matches as subject_matches
from shared.contracts.topology_yaml import MAX_YAML_DEPTH as MAX_YAML_DEPTH
from shared.contracts.topology_yaml import MAX_YAML_VALUES as MAX_YAML_VALUES
from shared.contracts.topology_yaml import load_yaml_mapping as load_yaml_mapping
from shared.domain.errors import ConfigurationError
from shared.domain.ordering import (
    PartitionFilterError,
    all_partitions_filter,
    consumer_name,
    ordering_key,
    partition_filters,
    partition_of,
    partition_replay_subject,
)
from shared.domain.subjects import replay_subject

_DURABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: A context or a durable (see :meth:`Topology._named`).
_Spec = TypeVar("_Spec", ContextSpec, DurableSpec)


class Topology(Model):
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
        return self._named("context", self.contexts, name)

    def durable(self, name: str) -> DurableSpec:
        """The durable called ``name``, or a :class:`ConfigurationError` listing the known ones."""
        return self._named("durable", self.durables, name)

    def _named(self, kind: str, specs: Mapping[str, _Spec], name: str) -> _Spec:
        try:
            return specs[name]
        except KeyError:
            known = ", ".join(sorted(specs))
            raise ConfigurationError(
                f"topology {self.name!r} has no {kind} {name!r} (known: {known})"
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
            return any(covers(p, subject) for p in spec.filter_subjects)
        filters = self.consumers(durable)[0].filters
        return any(covers(p, f"{subject}.0") for p in filters)


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
        if not any(covers(pattern, subject) for pattern in stream.subjects):
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


def read_topology(path: Path | str) -> Topology:
    """Read and validate a topology file, without its events; errors name file and field.

    :func:`shared.contracts.loading.load_topology` adds the events from the
    registry (the registry imports this module, so this one cannot call it).
    """
    return _load_file(Path(path))


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
