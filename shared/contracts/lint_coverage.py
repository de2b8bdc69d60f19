"""The lint's coverage gates on the declared events (the manifests, via the registry)."""

from __future__ import annotations

from pathlib import Path

from shared.contracts.lint_findings import Problem
from shared.contracts.topology import EventSpec, Topology


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
