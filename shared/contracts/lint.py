"""The configuration lint: settings that would lose or duplicate messages, refused early.

Every role runs it on its topology when it starts (:func:`require_clean_topology`, exit
code 2 on a finding), ``ferry lint`` runs it by hand, and ``ferry registry check`` (CI)
runs it on every shipped topology. Each finding names the file, the field and the rule:

    topologies/sea-vibespro.yaml: durables.sea__from_vibespro.max_deliver: 3 is shorter
    than the back-off ladder (5 steps) ... [max-deliver]

Rules (what each protects against):

``duplicate-window``
    A stream's duplicate window must cover the outbox-publisher's re-publish horizon, or
    a row re-published after a lost PubAck or a crash lands in the stream twice.
``inbox-retention``
    A context's ``inbox_retention`` must outlast every way a copy can still arrive: the
    source stream's ``max_age``, the redelivery horizon (every attempt and back-off) and
    the replay horizon (dead letters kept for their stream's ``max_age``, automatic replay
    schedule). A copy arriving after its inbox row is purged is processed twice.
``handler-timeout``
    Without heartbeats the handler timeout must stay below ``ack_wait``: otherwise
    JetStream redelivers a message whose handler is still running.
``max-deliver``
    ``max_deliver`` must be finite and at least the back-off ladder's length: unlimited
    redelivery retries a poison message forever, and a shorter one never reaches the
    ladder's last steps (the message is dead-lettered earlier than the ladder promises).
``ack-pending``
    ``max_ack_pending`` must hold at least two batches: the consumer pulls the next batch
    while one is in process (``FERRY_PIPELINE``), and a second replica needs room to pull
    at all. With one batch's worth, replicas take turns and each waits for the other's
    acks (measured: two replicas drained 13 times slower than one).
``dead-letter-stream``
    Every durable's dead-letter subject must be captured by a dead-letter stream (and by
    no event stream): otherwise a dead letter cannot be stored and its message is retried
    forever. Dead-letter streams themselves only take limits retention (the topology model
    refuses any other when the file is loaded), so a record never vanishes once read.
``naming``
    Durables are named ``{target}__from_{source}`` or INFRA-005's ``cg_<stage>``; stream
    subjects stay inside the context's namespace; filters are ``{ns}.>`` or
    ``{ns}.{event|*}.{vN|*}``; dead-letter subjects are the target context's
    ``dead_letter_subject`` (optionally ``.{durable}``). Names are how operators, metrics
    and the dlq tools find things. On a partitioned stream an unordered durable's filter
    ends in the partition token (``{ns}.{event|*}.{vN|*}.*``).
``ordering-replay``
    ``ordering: key`` with ``on_dead_letter: skip`` and ``replay: automatic`` cannot keep
    order: the key's later events go on past the dead letter, and the automatic replay of
    it then arrives after them — order broken twice, with no operator to decide. Use
    ``on_dead_letter: hold`` (the key waits for the replay) or ``replay: operator``.
``ordering-key-field``
    An event's ``ordering_key`` must name a property its schema requires, at every level
    of the dotted path, of type string or integer: otherwise a valid payload can lack its
    key (the publisher would set the row aside) or carry one that is not a scalar.
``ordering-timeout``
    On an ``ordering: key`` durable the handler timeout must stay below ``ack_wait``:
    a replica that stops renewing its partition loses it after ``ack_wait``, and a call
    it started could then outlive the takeover and run beside the new owner's call for
    the same key — heartbeats do not help, they only keep the message.
``ordering-unused``
    ``on_dead_letter`` on a durable with ``ordering: none`` has no effect: nothing is held
    or skipped after a dead letter of an unordered durable. Declare ``ordering: key`` or
    drop the field.
``criticality-throttle``
    A ``criticality: high`` durable may not declare a ``throttle``: a rate limit on a
    critical lane (INFRA-005 §7: "H publish: low frequency but high criticality") holds its
    messages back exactly when they matter, and its lag alert would fire on the throttle.
    Throttles are for non-critical lanes (§7.3: replay, non-critical publish jobs).
    (``criticality: high`` with ``replay: automatic`` is allowed: the first dead letter still
    pages, and the automatic replay only shortens the outage.)

Coverage gates on the declared events (the manifests, via the registry):

``missing-manifests``
    A topology with no declared events would dead-letter everything it receives.
``unreceived-event``
    A context handles an event but no durable targeting it filters the event's subject:
    the event never reaches the handler.
``unhandled-event``
    A context publishes an event version no context handles: its messages reach nobody.
``unexpected-delivery``
    A durable's filter delivers an event to a context that has no handler for it: every
    such message would be dead-lettered as ``UNKNOWN_EVENT``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shared.contracts.topology import (
    ContextSpec,
    DurableSpec,
    EventSpec,
    Topology,
    subject_matches,
)
from shared.domain import policy
from shared.domain.errors import ConfigurationError
from shared.domain.policy import ROW_RETRY_CAP_SECONDS
from shared.domain.subjects import SNAKE_CASE, replay_subject

_DAY, _HOUR, _MINUTE = 86400, 3600, 60


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One finding: where (file and field), which rule, and what is wrong."""

    source: str
    field: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.field}: {self.message} [{self.rule}]"


def format_duration(seconds: float) -> str:
    """``30d 18m 36s``-style, exact to the millisecond."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    whole, frac = divmod(seconds, 1)
    parts = []
    remaining = int(whole)
    for unit, size in (("d", _DAY), ("h", _HOUR), ("m", _MINUTE)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    if remaining or frac or not parts:
        secs = remaining + frac
        parts.append(f"{secs:g}s")
    return " ".join(parts)


# --- facts derived from the topology and the publisher's settings ----------------------


class _HasTiming(Protocol):
    """What :meth:`PublisherTiming.of` reads of ``PublisherSettings`` (runtime layer)."""

    @property
    def publish_timeout(self) -> float: ...
    @property
    def retry_max(self) -> float: ...
    @property
    def poll_interval(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PublisherTiming:
    """The outbox-publisher settings that bound when it can publish a row again."""

    publish_timeout: float
    retry_max: float
    poll_interval: float

    @classmethod
    def of(cls, settings: _HasTiming) -> PublisherTiming:
        """The timing a running publisher uses (its ``PublisherSettings``)."""
        return cls(settings.publish_timeout, settings.retry_max, settings.poll_interval)

    @classmethod
    def defaults(cls) -> PublisherTiming:
        """The timing of a publisher on default settings (what other roles and CI assume)."""
        return cls(policy.PUBLISH_TIMEOUT, policy.RETRY_MAX, policy.POLL_INTERVAL)

    def republish_horizon(self) -> float:
        """Longest time from a row's first publish to its re-publish.

        A row whose PubAck is lost (the message may be stored) is marked failed after
        ``publish_timeout`` with ``last_attempt_at`` = its claim's start; it is claimable
        again at most ``ROW_RETRY_CAP_SECONDS`` later, and a worker claims within
        ``retry_max`` (pause after a failed batch) plus ``poll_interval``. A crash before
        the mark releases the claim with the session, so it is re-claimed sooner.
        """
        return self.publish_timeout + ROW_RETRY_CAP_SECONDS + self.retry_max + self.poll_interval


def redelivery_horizon(durable: DurableSpec) -> float:
    """Longest time from a message's first delivery to its last redelivery by ``durable``.

    Every one of ``max_deliver`` attempts may run to ``ack_wait`` (or the handler timeout
    if longer, with heartbeats), and attempt n waits the n-th back-off step before the next.
    """
    attempt = max(durable.ack_wait, durable.handler.timeout)
    ladder = durable.backoff
    delays = sum(ladder[min(n, len(ladder) - 1)] for n in range(durable.max_deliver - 1))
    return durable.max_deliver * attempt + delays


def automatic_replay_span(durable: DurableSpec) -> float:
    """Sum of the dlq-replayer's longest waits before each automatic replay."""
    limits = durable.replay_limits
    return sum(
        min(limits.max_delay, limits.base_delay * 2.0**n) for n in range(limits.max_attempts)
    )


def replay_horizon(topology: Topology, durable: DurableSpec) -> float:
    """Longest time from a message's first delivery to the last delivery of a replay of it.

    A message is dead-lettered at most one redelivery horizon after it first arrives; an
    operator can replay its dead letter as long as the dead-letter stream keeps it, and the
    automatic replayer spaces its attempts by the back-off schedule (each replay delivered
    with the full redelivery ladder); the replay itself can then be redelivered.
    """
    redelivery = redelivery_horizon(durable)
    kept = max(
        (
            s.max_age
            for s in topology.dead_letter_streams
            if any(subject_matches(p, durable.dead_letter_subject) for p in s.subjects)
        ),
        default=0.0,
    )
    automatic = 0.0
    if durable.replay == "automatic":
        automatic = automatic_replay_span(durable) + durable.replay_limits.max_attempts * redelivery
    return redelivery + max(kept, automatic) + redelivery


# --- the rules ---------------------------------------------------------------------------


def lint_topology(
    topology: Topology, *, source: str, publisher: PublisherTiming | None = None
) -> list[Problem]:
    """Every lint finding and coverage-gate failure of ``topology``, sorted."""
    timing = publisher or PublisherTiming.defaults()
    problems = [
        *_duplicate_window(topology, source, timing),
        *_inbox_retention(topology, source),
        *_handler_timeout(topology, source),
        *_max_deliver(topology, source),
        *_ack_pending(topology, source),
        *_dead_letter_streams(topology, source),
        *_naming(topology, source),
        *_ordering(topology, source),
        *_criticality(topology, source),
        *coverage_problems(topology, source=source),
    ]
    return sorted(problems)


def require_clean_topology(
    topology: Topology, *, source: str | Path, publisher: PublisherTiming | None = None
) -> None:
    """Raise :class:`ConfigurationError` listing every finding; a role calls it at start."""
    problems = lint_topology(topology, source=str(source), publisher=publisher)
    if problems:
        lines = "\n".join(str(p) for p in problems)
        raise ConfigurationError(
            f"topology {topology.name!r} fails the configuration lint "
            f"({len(problems)} finding(s); `ferry lint` explains):\n{lines}"
        )


def _duplicate_window(
    topology: Topology, source: str, timing: PublisherTiming
) -> Iterator[Problem]:
    horizon = timing.republish_horizon()
    for name, ctx in sorted(topology.contexts.items()):
        if ctx.stream is None or ctx.stream.duplicate_window >= horizon:
            continue
        yield Problem(
            source,
            f"contexts.{name}.stream.duplicate_window",
            "duplicate-window",
            f"{format_duration(ctx.stream.duplicate_window)} is shorter than the "
            f"outbox-publisher's re-publish horizon ({format_duration(horizon)} = "
            f"publish timeout {format_duration(timing.publish_timeout)} + row back-off cap "
            f"{format_duration(ROW_RETRY_CAP_SECONDS)} + retry_max "
            f"{format_duration(timing.retry_max)} + poll interval "
            f"{format_duration(timing.poll_interval)}): a row re-published after a lost "
            "PubAck would be stored twice",
        )


def _inbox_retention(topology: Topology, source: str) -> Iterator[Problem]:
    streams = topology.streams_by_name()
    for name, ctx in sorted(topology.contexts.items()):
        needs: list[tuple[float, str]] = []
        for durable_name, durable in sorted(topology.durables.items()):
            if durable.target != name:
                continue
            stream = streams[durable.stream]
            needs += [
                (stream.max_age, f"max_age of stream {stream.name}"),
                (redelivery_horizon(durable), f"redelivery horizon of {durable_name}"),
                (replay_horizon(topology, durable), f"replay horizon of {durable_name}"),
            ]
        if not needs:
            continue
        need, what = max(needs, key=lambda item: item[0])
        if ctx.inbox_retention < need:
            yield Problem(
                source,
                f"contexts.{name}.inbox_retention",
                "inbox-retention",
                f"{format_duration(ctx.inbox_retention)} is shorter than the {what} "
                f"({format_duration(need)}): a copy arriving after its inbox row is "
                "purged would be processed twice",
            )


def _handler_timeout(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        if durable.heartbeats or durable.handler.timeout < durable.ack_wait:
            continue
        yield Problem(
            source,
            f"durables.{name}.handler.timeout",
            "handler-timeout",
            f"{format_duration(durable.handler.timeout)} is not below ack_wait "
            f"{format_duration(durable.ack_wait)} and heartbeats are off: JetStream would "
            "redeliver a message whose handler is still running",
        )


def _max_deliver(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        field = f"durables.{name}.max_deliver"
        if durable.max_deliver < 1:
            yield Problem(
                source,
                field,
                "max-deliver",
                f"{durable.max_deliver} means unlimited redelivery: a poison message would "
                "be retried forever; give a finite count",
            )
        elif durable.max_deliver < len(durable.backoff):
            yield Problem(
                source,
                field,
                "max-deliver",
                f"{durable.max_deliver} is shorter than the back-off ladder "
                f"({len(durable.backoff)} steps): messages are dead-lettered before the "
                "ladder's last steps are ever used",
            )


def _ack_pending(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        if durable.max_ack_pending >= 2 * durable.batch_size:
            continue
        yield Problem(
            source,
            f"durables.{name}.max_ack_pending",
            "ack-pending",
            f"{durable.max_ack_pending} holds fewer than two batches of {durable.batch_size}: "
            "the next batch (or a second replica) cannot be pulled while one is in process; "
            f"give max_ack_pending >= {2 * durable.batch_size} or a smaller batch_size",
        )


def _dead_letter_streams(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        subject = durable.dead_letter_subject
        field = f"durables.{name}.dead_letter_subject"
        events = [
            s.name
            for s in topology.streams_by_name().values()
            if any(subject_matches(p, subject) for p in s.subjects)
        ]
        held = any(
            subject_matches(p, subject) for s in topology.dead_letter_streams for p in s.subjects
        )
        if events:
            yield Problem(
                source,
                field,
                "dead-letter-stream",
                f"{subject!r} is captured by event stream {events[0]}: dead letters must "
                "go to a dead-letter stream, not be mixed with events",
            )
        elif not held:
            yield Problem(
                source,
                field,
                "dead-letter-stream",
                f"no dead-letter stream captures {subject!r}: a dead letter could not be "
                "stored and its message would be retried forever",
            )


def _naming(topology: Topology, source: str) -> Iterator[Problem]:
    for name, ctx in sorted(topology.contexts.items()):
        yield from _stream_subjects(name, ctx, source)
    for name, durable in sorted(topology.durables.items()):
        yield from _durable_names(topology, name, durable, source)


def _stream_subjects(name: str, ctx: ContextSpec, source: str) -> Iterator[Problem]:
    if ctx.stream is None:
        return
    for index, pattern in enumerate(ctx.stream.subjects):
        if not subject_matches(f"{ctx.namespace}.>", pattern) or pattern == ctx.namespace:
            yield Problem(
                source,
                f"contexts.{name}.stream.subjects[{index}]",
                "naming",
                f"{pattern!r} reaches outside the context's namespace: a context's stream "
                f"captures {ctx.namespace}.> only",
            )


def _durable_names(
    topology: Topology, name: str, durable: DurableSpec, source: str
) -> Iterator[Problem]:
    origin = topology.context_of_stream(durable.stream)
    expected = f"{durable.target}__from_{origin}"
    is_group = name.startswith("cg_") and SNAKE_CASE.match(name[3:]) is not None
    if name != expected and not is_group:
        yield Problem(
            source,
            f"durables.{name}",
            "naming",
            f"name {name!r} breaks the convention: expected {expected!r} "
            "({target}__from_{source}) or an INFRA-005 consumer group cg_<stage>",
        )
    namespace = topology.contexts[origin].namespace
    partitioned = topology.streams_by_name()[durable.stream].partitions > 1
    for index, pattern in enumerate(durable.filter_subjects):
        if not _conventional_filter(pattern, namespace, durable.stream, name, partitioned):
            token = ".*" if partitioned and durable.ordering == "none" else ""
            yield Problem(
                source,
                f"durables.{name}.filter_subjects[{index}]",
                "naming",
                f"{pattern!r} is not a conventional filter: use {namespace}.> or "
                f"{namespace}.<event_type|*>.<vN|*>{token}",
            )
    base = topology.contexts[durable.target].dead_letter_subject
    if durable.dead_letter_subject not in (base, f"{base}.{name}"):
        yield Problem(
            source,
            f"durables.{name}.dead_letter_subject",
            "naming",
            f"{durable.dead_letter_subject!r} breaks the convention: expected {base!r} or "
            f"'{base}.{name}' (the target context's dead_letter_subject)",
        )


def _conventional_filter(
    pattern: str, namespace: str, stream: str, durable: str, partitioned: bool = False
) -> bool:
    if pattern == f"{namespace}.>" or pattern == replay_subject(stream, durable):
        return True
    prefix = namespace + "."
    if not pattern.startswith(prefix):
        return False
    tokens = pattern[len(prefix) :].split(".")
    if partitioned and len(tokens) == 3 and tokens[2] == "*":
        tokens = tokens[:2]  # the partition token of every partition
    if len(tokens) != 2:
        return False
    event, version = tokens
    event_ok = event == "*" or SNAKE_CASE.match(event) is not None
    version_ok = version == "*" or (
        version.startswith("v") and version[1:].isdigit() and not version[1:].startswith("0")
    )
    return event_ok and version_ok


# --- ordering ------------------------------------------------------------------------------


def _ordering(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        prefix = f"durables.{name}"
        if durable.ordering == "none":
            if "on_dead_letter" in durable.model_fields_set:
                yield Problem(
                    source,
                    f"{prefix}.on_dead_letter",
                    "ordering-unused",
                    f"{durable.on_dead_letter} has no effect with ordering: none: nothing "
                    "waits behind a dead letter of an unordered durable; declare ordering: "
                    "key or drop on_dead_letter",
                )
            continue
        if durable.on_dead_letter == "skip" and durable.replay == "automatic":
            yield Problem(
                source,
                f"{prefix}.on_dead_letter",
                "ordering-replay",
                "skip with replay: automatic cannot keep the key's order: its later events "
                "go on past the dead letter, and the automatic replay of it then arrives "
                "after them (order broken twice); use on_dead_letter: hold, whose key waits "
                "for the replay, or replay: operator",
            )
        if durable.handler.timeout >= durable.ack_wait:
            yield Problem(
                source,
                f"{prefix}.handler.timeout",
                "ordering-timeout",
                f"{format_duration(durable.handler.timeout)} is not below ack_wait "
                f"{format_duration(durable.ack_wait)}: with ordering: key a partition whose "
                "owner stops renewing it is taken over after ack_wait, and a handler call "
                "the old owner started could outlive the takeover and run beside the new "
                "owner's call for the same key",
            )
    for event in topology.events:
        if event.ordering_key is None:
            continue
        reason = ordering_key_defect(event.payload_schema or {}, event.ordering_key)
        if reason:
            yield Problem(
                event.manifest or source,
                f"publishes.{event.name}.ordering_key",
                "ordering-key-field",
                f"{event.ordering_key!r} {reason}: a valid payload could lack its ordering "
                "key or carry one that is not a string or an integer",
            )


def ordering_key_defect(schema: Mapping[str, Any], path: str) -> str | None:
    """Why ``path`` is not a required string/integer property of ``schema`` (None: it is)."""
    node: Mapping[str, Any] = schema
    parts = path.split(".")
    for depth, part in enumerate(parts):
        properties = node.get("properties")
        required = node.get("required")
        where = ".".join(parts[:depth]) or "the payload"
        if not isinstance(properties, Mapping) or part not in properties:
            return f"is not a property of the schema (no {part!r} in {where})"
        if not isinstance(required, list) or part not in required:
            return f"is not required by the schema ({part!r} is optional in {where})"
        child = properties[part]
        if not isinstance(child, Mapping):
            return f"has no usable schema at {'.'.join(parts[: depth + 1])!r}"
        node = child
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds or not set(kinds) <= {"string", "integer"}:
        return f"is typed {node.get('type')!r} in the schema, not string or integer"
    return None


# --- criticality ---------------------------------------------------------------------------


def _criticality(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        if durable.criticality == "high" and durable.throttle is not None:
            yield Problem(
                source,
                f"durables.{name}.throttle",
                "criticality-throttle",
                f"{durable.throttle.limit().describe()} on a criticality: high durable: a "
                "throttle holds a critical lane's messages back exactly when they matter "
                "(and its lag alert fires on the throttle); drop the throttle or the "
                "criticality",
            )


# --- coverage gates ------------------------------------------------------------------------


def event_subject_of(topology: Topology, event: EventSpec) -> str:
    """The subject ``event`` is published on in ``topology``."""
    return f"{topology.contexts[event.context].namespace}.{event.type}.v{event.version}"


def coverage_problems(topology: Topology, *, source: str) -> list[Problem]:
    """Coverage-gate failures of ``topology``'s declared events."""
    if not topology.events:
        return [
            Problem(
                source,
                "name",
                "missing-manifests",
                f"no events are declared for topology {topology.name!r}: declare them in "
                f"manifests/{topology.name}/<context>.yaml and run `ferry registry generate`",
            )
        ]
    problems: list[Problem] = []
    for event in topology.events:
        problems += _event_coverage(topology, event)
    problems += _unexpected_deliveries(topology, source)
    return problems


def _event_coverage(topology: Topology, event: EventSpec) -> list[Problem]:
    subject = event_subject_of(topology, event)
    producer = topology.contexts[event.context]
    if not event.handlers:
        return [
            Problem(
                event.manifest,
                f"publishes.{event.name}",
                "unhandled-event",
                f"context {event.context} publishes {event.type} v{event.version}, but no "
                "context handles it: its messages would reach no handler",
            )
        ]
    problems = []
    for context in sorted(event.handlers):
        receivers = [d for d in event.handled_by if topology.durables[d].target == context]
        if receivers:
            continue
        where = f"stream {producer.stream.name}" if producer.stream else "no stream"
        problems.append(
            Problem(
                _handler_manifest(event, context),
                f"handles.{event.context}.{event.name}",
                "unreceived-event",
                f"context {context} handles {event.type} v{event.version} of context "
                f"{event.context}, but no durable targeting {context} has a filter covering "
                f"{subject} ({where}): the event would never reach its handler",
            )
        )
    return problems


def _handler_manifest(event: EventSpec, context: str) -> str:
    """The handling context's manifest, beside the producer's."""
    if not event.manifest:
        return f"manifests/{context}.yaml"
    return str(Path(event.manifest).with_name(f"{context}.yaml"))


def _unexpected_deliveries(topology: Topology, source: str) -> list[Problem]:
    problems = []
    for event in topology.events:
        producer = topology.contexts[event.context]
        if producer.stream is None:
            continue
        subject = event_subject_of(topology, event)
        for name, durable in sorted(topology.durables.items()):
            if durable.stream != producer.stream.name or durable.target in event.handlers:
                continue
            if topology.delivers(name, subject):
                problems.append(
                    Problem(
                        source,
                        f"durables.{name}.filter_subjects",
                        "unexpected-delivery",
                        f"delivers {event.type} v{event.version} of context {event.context} "
                        f"({subject}) to context {durable.target}, which has no handler for "
                        "it: every such message would be dead-lettered as UNKNOWN_EVENT",
                    )
                )
    return problems
