"""What the topology says the job must read and expect (pure: no Spark, no I/O).

A *source* is a context with a stream: its database's ``outbox_events`` holds what it
produced. A *route* says that an event (context, type, version) is published on a subject
and that a durable should receive it: the durable consumes the context's stream and its
filters take the subject (:meth:`Topology.delivers`: what JetStream itself delivers, the
partition token of a partitioned stream included). Events no durable subscribes to get the
route ``-`` so that they still count as produced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

#: The durable of events nobody subscribes to (they count for the delivery rate only).
NO_DURABLE = "-"
#: The subject of a durable's roll-up row (every subject it receives).
ALL_SUBJECTS = "*"


@dataclass(frozen=True, slots=True)
class Source:
    """A producing context: whose outbox to read."""

    context: str
    database: str
    namespace: str
    stream: str


@dataclass(frozen=True, slots=True)
class Target:
    """A durable and the context (and database) holding its inbox."""

    durable: str
    context: str
    database: str


@dataclass(frozen=True, slots=True)
class Route:
    """An event kind of a context, its subject, and one durable that should receive it."""

    context: str
    event_type: str
    event_version: int
    subject: str
    durable: str
    target_context: str | None
    target_database: str | None


@dataclass(frozen=True, slots=True)
class Combo:
    """One row key of the KPI table besides the window."""

    context: str
    durable: str
    subject: str
    target_context: str | None


class Plan:
    """The topology seen from the KPI job."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.sources = _sources(topology)
        self.targets = {
            name: Target(name, d.target, topology.contexts[d.target].database)
            for name, d in sorted(topology.durables.items())
        }

    @property
    def name(self) -> str:
        """The topology's name (a key of every KPI row)."""
        return self.topology.name

    def critical_durables(self) -> list[str]:
        """Durables declared ``criticality: high`` (the report lists them first)."""
        return sorted(n for n, d in self.topology.durables.items() if d.criticality == "high")

    def first_database(self) -> str:
        """The database of the topology's first context (the default KPI database)."""
        return next(iter(self.topology.contexts.values())).database

    def kpi_database(self, configured: str | None) -> str:
        """The database the results go to: ``configured`` if set (one of the topology's,
        since only those are migrated), else the first context's."""
        if configured is None:
            return self.first_database()
        if configured not in self.topology.databases():
            known = ", ".join(self.topology.databases())
            raise ConfigurationError(
                f"FERRY_KPI_DATABASE {configured!r} is not a database of topology "
                f"{self.name!r} (ferry migrate creates the KPI tables in: {known})"
            )
        return configured

    def inbox_databases(self) -> dict[str, list[str]]:
        """Database → the durables whose inbox it holds."""
        out: dict[str, list[str]] = {}
        for target in self.targets.values():
            out.setdefault(target.database, []).append(target.durable)
        return out

    def parking_databases(self) -> dict[str, list[str]]:
        """Database → its ``ordering: key`` durables (only they park messages)."""
        out: dict[str, list[str]] = {}
        for target in self.targets.values():
            if self.topology.durables[target.durable].ordering == "key":
                out.setdefault(target.database, []).append(target.durable)
        return out

    def databases(self) -> list[str]:
        """Every database the job reads, in a stable order."""
        names = {s.database for s in self.sources} | set(self.inbox_databases())
        return sorted(names)

    def subject(self, context: str, event_type: str, event_version: int) -> str:
        """The subject an event of ``context`` is published on."""
        namespace = self.topology.contexts[context].namespace
        return f"{namespace}.{event_type}.v{event_version}"

    def targets_of(self, context: str, subject: str) -> list[Target]:
        """Durables that should receive ``subject`` published by ``context``."""
        spec = self.topology.contexts[context]
        if spec.stream is None:
            return []
        return [
            target
            for name, target in self.targets.items()
            if self.topology.durables[name].stream == spec.stream.name
            and self.topology.delivers(name, subject)
        ]

    def routes(self, kinds: Iterable[tuple[str, str, int]]) -> list[Route]:
        """Routes of the (context, event_type, event_version) kinds found in the outboxes."""
        out = []
        for context, event_type, version in sorted(set(kinds)):
            subject = self.subject(context, event_type, version)
            targets = self.targets_of(context, subject)
            if not targets:
                out.append(Route(context, event_type, version, subject, NO_DURABLE, None, None))
            out += [
                Route(context, event_type, version, subject, t.durable, t.context, t.database)
                for t in targets
            ]
        return out

    def combos(self, seen: Iterable[Combo] = ()) -> list[Combo]:
        """Every row key a window should have: manifests, durables' roll-ups, and ``seen``."""
        keys = set(seen)
        for route in self.routes((e.context, e.type, e.version) for e in self.topology.events):
            keys.add(Combo(route.context, route.durable, route.subject, route.target_context))
            keys.add(Combo(route.context, route.durable, ALL_SUBJECTS, route.target_context))
        for name, durable in self.topology.durables.items():
            source = self.topology.context_of_stream(durable.stream)
            keys.add(Combo(source, name, ALL_SUBJECTS, durable.target))
        return sorted(keys, key=lambda c: (c.context, c.durable, c.subject))


def _sources(topology: Topology) -> list[Source]:
    sources = [
        Source(name, ctx.database, ctx.namespace, ctx.stream.name)
        for name, ctx in topology.contexts.items()
        if ctx.stream is not None
    ]
    by_db: dict[str, str] = {}
    for source in sources:
        if source.database in by_db:
            raise ConfigurationError(
                f"topology {topology.name!r}: contexts {by_db[source.database]!r} and "
                f"{source.context!r} both publish from database {source.database!r}; the KPI "
                "job cannot tell their outbox rows apart"
            )
        by_db[source.database] = source.context
    return sources
