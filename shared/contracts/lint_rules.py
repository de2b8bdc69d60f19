"""The lint's rules on the settings of streams, contexts and durables.

One function a rule (named in :mod:`shared.contracts.lint`'s docstring), each yielding its
findings: duplicate window, inbox retention, handler timeout, max deliver, ack pending,
dead-letter streams, naming and criticality. The ordering rules are in
:mod:`shared.contracts.lint_ordering`, the coverage gates in
:mod:`shared.contracts.lint_coverage`.
"""

from __future__ import annotations

from collections.abc import Iterator

from shared.contracts.lint_findings import Problem, format_duration
from shared.contracts.lint_horizons import PublisherTiming, copy_horizons
from shared.contracts.topology import ContextSpec, DurableSpec, Topology, subject_matches
from shared.domain.policy import ROW_RETRY_CAP_SECONDS
from shared.domain.subjects import SNAKE_CASE, replay_subject


def duplicate_window(topology: Topology, source: str, timing: PublisherTiming) -> Iterator[Problem]:
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


def inbox_retention(topology: Topology, source: str) -> Iterator[Problem]:
    for name, ctx in sorted(topology.contexts.items()):
        needs = copy_horizons(topology, name)
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


def handler_timeout(topology: Topology, source: str) -> Iterator[Problem]:
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


def max_deliver(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        if durable.max_deliver < 1:
            why = (
                f"{durable.max_deliver} means unlimited redelivery: a poison message would "
                "be retried forever; give a finite count"
            )
        elif durable.max_deliver < len(durable.backoff):
            why = (
                f"{durable.max_deliver} is shorter than the back-off ladder "
                f"({len(durable.backoff)} steps): messages are dead-lettered before the "
                "ladder's last steps are ever used"
            )
        else:
            continue
        yield Problem(source, f"durables.{name}.max_deliver", "max-deliver", why)


def ack_pending(topology: Topology, source: str) -> Iterator[Problem]:
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


def dead_letter_streams(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        subject = durable.dead_letter_subject
        events = [
            s.name
            for s in topology.streams_by_name().values()
            if any(subject_matches(p, subject) for p in s.subjects)
        ]
        held = any(
            subject_matches(p, subject) for s in topology.dead_letter_streams for p in s.subjects
        )
        if events:
            why = (
                f"{subject!r} is captured by event stream {events[0]}: dead letters must "
                "go to a dead-letter stream, not be mixed with events"
            )
        elif not held:
            why = (
                f"no dead-letter stream captures {subject!r}: a dead letter could not be "
                "stored and its message would be retried forever"
            )
        else:
            continue
        field = f"durables.{name}.dead_letter_subject"
        yield Problem(source, field, "dead-letter-stream", why)


def naming(topology: Topology, source: str) -> Iterator[Problem]:
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


# --- criticality ---------------------------------------------------------------------------


def criticality(topology: Topology, source: str) -> Iterator[Problem]:
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
