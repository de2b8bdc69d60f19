"""Build-time side of the registry: generate the registry file, lock schema fingerprints, check.

``generate`` compiles ``<manifests>/<topology>/<context>.yaml`` into a registry file (JSON,
:mod:`.registry_file`; stable order, byte-identical on every run) and adds each new event
version's fingerprint to ``<manifests>/schemas.lock``. It refuses, and writes nothing, when
a locked version's schema has changed (INV-023). Ferry's own manifests compile into the
shipped ``shared/contracts/registry.json``; a team's, kept outside Ferry's tree, into a
file of its own that its roles load through ``FERRY_REGISTRY`` (a :class:`Layout` says
where each part is).

``check`` (CI runs it through the test suite) fails on:

``stale-registry``
    the registry file differs from what the manifests generate, or a declared version
    is not in the lock yet: the workers would run with an outdated registry;
``immutable-version``
    a locked version's schema constraints changed: consumers of the published version
    would get payloads of a different meaning (declare ``.v{n+1}`` instead);
``handler-missing``
    a manifest names a handler function that does not exist or is not ``async``;
``unknown-topology`` / ``unknown-context``
    manifests for a topology or context that does not exist;
``unpublished-event``
    a handler for an event no manifest publishes;

and on every lint rule and coverage gate of :mod:`shared.contracts.lint`, for every topology.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared.contracts.events import ONE_STATEMENT_MARK
from shared.contracts.layout import LOCK, LOCK_NAME, MANIFESTS, REGISTRY, ROOT, TOPOLOGIES
from shared.contracts.lint import Problem, lint_topology
from shared.contracts.loading import load_topology
from shared.contracts.manifests import (
    DeclaredEvent,
    compile_manifests,
    event_specs,
    load_manifest_set,
)
from shared.contracts.registry_file import lock_key, parse_registry, render_registry
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

__all__ = ["LOCK", "MANIFESTS", "REGISTRY", "ROOT", "TOPOLOGIES", "Layout", "check", "generate"]

_LOCK_HEADER = """\
# Schema fingerprints of every published event version (INV-023), kept by
# `ferry registry generate`. An entry is added when a version first appears and is never
# changed or removed, so a version can never come back with a different meaning: a change
# to a version's schema constraints must be published as the next version.
# Key: <topology>/<producing context>/<event_type>.v<n>; value: sha256 of the constraints.
"""


@dataclass(frozen=True)
class Layout:
    """Where one registry's parts are: manifests, topology files, lock, registry file.

    Labels in findings and in the registry file (``manifest`` fields) are paths relative
    to ``label_root``, so a generated file does not depend on where it was generated.
    """

    manifests: Path
    topologies: tuple[Path, ...]
    lock: Path
    registry: Path
    label_root: Path

    @classmethod
    def project(cls, root: Path = ROOT) -> Layout:
        """The layout of a project root (Ferry's own by default)."""
        return cls(
            manifests=root / MANIFESTS,
            topologies=tuple(sorted((root / TOPOLOGIES).glob("*.yaml"))),
            lock=root / LOCK,
            registry=root / REGISTRY,
            label_root=root,
        )

    @classmethod
    def of(
        cls,
        manifests: Path,
        registry: Path,
        *,
        topologies: Path | None = None,
        topology_files: tuple[Path, ...] = (),
        lock: Path | None = None,
    ) -> Layout:
        """A team's layout: ``manifests`` (its lock inside it unless ``lock`` says otherwise);
        topology files named, else every ``*.yaml`` of ``topologies`` (default: the
        ``topologies/`` directory beside ``manifests``)."""
        manifests = manifests.absolute()
        if not topology_files:
            directory = topologies if topologies is not None else manifests.parent / TOPOLOGIES
            if not directory.is_dir():
                raise ConfigurationError(
                    f"{directory}: no topologies directory (name the topology files with "
                    "--topology FILE or their directory with --topologies DIR)"
                )
            topology_files = tuple(sorted(directory.glob("*.yaml")))
        return cls(
            manifests=manifests,
            topologies=tuple(topology_files),
            lock=lock if lock is not None else manifests / LOCK_NAME,
            registry=registry,
            label_root=manifests.parent,
        )

    def label(self, path: Path) -> str:
        """``path`` relative to the label root where it lies under it."""
        try:
            return str(path.absolute().relative_to(self.label_root.absolute()))
        except ValueError:
            return str(path)


def _layout(where: Path | Layout) -> Layout:
    return where if isinstance(where, Layout) else Layout.project(where)


@dataclass
class Sources:
    """Everything the manifests and topologies under one root say, compiled."""

    layout: Layout
    topologies: dict[str, tuple[str, Topology]] = field(default_factory=dict)
    events: dict[str, list[DeclaredEvent]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def load_sources(where: Path | Layout = ROOT) -> Sources:
    """Load the topology files and every manifest set of a layout and compile them."""
    layout = _layout(where)
    sources = Sources(layout)
    for path in layout.topologies:
        topology = load_topology(path, with_events=False)
        sources.topologies[topology.name] = (layout.label(path), topology)
    manifest_root = layout.manifests
    if not manifest_root.is_dir():
        raise ConfigurationError(f"{manifest_root}: no manifests directory")
    for directory in sorted(p for p in manifest_root.iterdir() if p.is_dir()):
        manifests = load_manifest_set(directory, label_root=layout.label_root)
        known = sources.topologies.get(directory.name)
        if known is None:
            sources.problems.append(
                Problem(
                    layout.label(directory),
                    "(directory)",
                    "unknown-topology",
                    f"no topology file is named {directory.name!r} "
                    f"(known: {', '.join(sorted(sources.topologies)) or 'none'})",
                )
            )
            continue
        label, topology = known
        events, problems = compile_manifests(manifests, topology, topology_source=label)
        sources.events[directory.name] = events
        sources.problems += problems
    return sources


# --- the lock -----------------------------------------------------------------------------


def read_lock(path: Path, label: str = LOCK) -> dict[str, str]:
    """The lock file's entries (an absent file is an empty lock)."""
    if not path.exists():
        return {}
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2 or not parts[1].startswith("sha256:") or parts[0] in entries:
            raise ConfigurationError(
                f"{label}: line {number}: expected '<topology>/<context>/<type>.v<n> "
                f"sha256:<hex>' once per version, got {text!r}"
            )
        entries[parts[0]] = parts[1]
    return entries


def render_lock(entries: Mapping[str, str]) -> str:
    """The lock file's text, entries sorted."""
    return _LOCK_HEADER + "".join(f"{key} {value}\n" for key, value in sorted(entries.items()))


def lock_problems(sources: Sources, lock: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    """(changed locked versions, keys of versions not locked yet)."""
    changed: list[Problem] = []
    unlocked: list[str] = []
    for topology, events in sorted(sources.events.items()):
        for event in events:
            key = lock_key(topology, event)
            locked = lock.get(key)
            if locked is None:
                unlocked.append(key)
            elif locked != event.fingerprint:
                changed.append(_changed(topology, event, locked, lock, sources))
    return changed, unlocked


def _changed(
    topology: str,
    event: DeclaredEvent,
    locked: str,
    lock: Mapping[str, str],
    sources: Sources,
) -> Problem:
    prefix = f"{topology}/{event.producer}/{event.type}.v"
    versions = [int(k[len(prefix) :]) for k in lock if k.startswith(prefix)]
    versions += [
        e.version
        for e in sources.events[topology]
        if (e.producer, e.type) == (event.producer, event.type)
    ]
    following = max(versions) + 1
    return Problem(
        event.manifest,
        f"publishes.{event.name}.schema",
        "immutable-version",
        f"{event.type} v{event.version} of context {event.producer} is locked at "
        f"{_short(locked)}, but its schema now fingerprints as {_short(event.fingerprint)}: "
        f"a published version never changes; declare the change as {event.type}.v{following}",
    )


def _short(fingerprint: str) -> str:
    return fingerprint[: len("sha256:") + 12]


# --- generate and check -------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    """What ``generate`` wrote (paths as labels of the layout) and what it newly locked."""

    written: list[str]
    locked: list[str]


def generate(where: Path | Layout = ROOT) -> Generated:
    """Write the registry file and extend the lock; refuse if a locked version changed."""
    layout = _layout(where)
    sources = load_sources(layout)
    lock = read_lock(layout.lock, layout.label(layout.lock))
    changed, unlocked = lock_problems(sources, lock)
    if changed:
        raise ConfigurationError(
            "refusing to generate: " + "\n".join(str(p) for p in sorted(changed))
        )
    by_key = _by_key(sources)
    new_lock = {**lock, **{key: by_key[key].fingerprint for key in unlocked}}
    written = []
    outputs = (
        (layout.lock, render_lock(new_lock)),
        (layout.registry, render_registry(sources.events, new_lock)),
    )
    for path, text in outputs:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(layout.label(path))
    return Generated(written, sorted(unlocked))


def _by_key(sources: Sources) -> dict[str, DeclaredEvent]:
    return {
        lock_key(topology, event): event
        for topology, events in sources.events.items()
        for event in events
    }


def check(where: Path | Layout = ROOT) -> list[Problem]:
    """Every reason the manifests, lock, registry file or topologies are not releasable."""
    layout = _layout(where)
    sources = load_sources(layout)
    lock_label = layout.label(layout.lock)
    lock = read_lock(layout.lock, lock_label)
    changed, unlocked = lock_problems(sources, lock)
    problems = [*sources.problems, *changed]
    by_key = _by_key(sources)
    for key in unlocked:
        event = by_key[key]
        problems.append(
            Problem(
                event.manifest,
                f"publishes.{event.name}",
                "stale-registry",
                f"{event.type} v{event.version} of context {event.producer} is not in "
                f"{lock_label} yet: run `ferry registry generate` and commit the result",
            )
        )
    problems += _registry_staleness(layout, sources, lock)
    problems += _handler_problems(sources)
    problems += _topology_problems(sources)
    return sorted(set(problems))


def _registry_staleness(layout: Layout, sources: Sources, lock: Mapping[str, str]) -> list[Problem]:
    path = layout.registry
    expected = render_registry(sources.events, lock)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [_stale(layout, "is missing")]
    except OSError as exc:
        return [_stale(layout, f"cannot be read ({exc.strerror})")]
    if data == expected.encode("utf-8"):
        return []
    label = layout.label(path)
    try:
        parse_registry(data, label)
    except ConfigurationError as exc:
        first = str(exc).splitlines()[0].removeprefix(f"{label}: ")
        return [_stale(layout, f"is not a valid registry file ({first})")]
    actual = data.decode("utf-8").splitlines()
    wanted = expected.splitlines()
    line = next(
        (n for n, (a, b) in enumerate(zip(actual, wanted, strict=False), start=1) if a != b),
        min(len(actual), len(wanted)) + 1,
    )
    return [_stale(layout, f"differs from what the manifests generate (first at line {line})")]


def _stale(layout: Layout, detail: str) -> Problem:
    return Problem(
        layout.label(layout.registry),
        "(file)",
        "stale-registry",
        f"{detail}: run `ferry registry generate` and commit the result",
    )


def _handler_problems(sources: Sources) -> list[Problem]:
    problems = []
    for events in sources.events.values():
        for event in events:
            for binding in event.handlers:
                reason = handler_defect(binding.handler)
                if reason:
                    problems.append(
                        Problem(
                            binding.manifest,
                            f"handles.{event.producer}.{event.name}.handler",
                            "handler-missing",
                            reason,
                        )
                    )
    return problems


ROUTE_FORMS = (
    "not a route (a route is `async def f(conn, request)`, or `def f(request)` "
    "returning a Statement and marked @one_statement)"
)


def handler_defect(reference: str) -> str | None:
    """Why ``module:function`` is not a usable route, or None if it is one."""
    module_name, _, function = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return f"{reference}: module {module_name} cannot be imported ({exc})"
    target = getattr(module, function, None)
    if target is None:
        return f"{reference}: module {module_name} has no {function}"
    if not (inspect.iscoroutinefunction(target) or getattr(target, ONE_STATEMENT_MARK, False)):
        return f"{reference}: {ROUTE_FORMS}"
    return None


def _topology_problems(sources: Sources) -> list[Problem]:
    problems = []
    for name, (label, topology) in sorted(sources.topologies.items()):
        events = [
            e
            for e in sources.events.get(name, [])
            if e.producer in topology.contexts
            and all(b.context in topology.contexts for b in e.handlers)
        ]
        with_events = topology.model_copy(update={"events": event_specs(topology, events)})
        problems += lint_topology(with_events, source=label)
    return problems
