"""The handler registry at run time: what the workers take from the registry file.

The registry is a data file (:mod:`shared.contracts.registry_file`) written from the
manifests by ``ferry registry generate``: Ferry's own (``shared/contracts/registry.json``)
unless ``FERRY_REGISTRY`` names another, a team's, generated from manifests outside
Ferry's tree. It is read once, at start, and never reloaded: a change to what a context
publishes or handles takes a regeneration and a restart (REQ-060). From it:

* :func:`attach_events` gives a loaded topology its events (``load_topology`` calls it);
* :func:`accepted_events` tells an inbox-consumer which (type, version) pairs its durable
  handles, with each one's payload validator (a failing payload is dead-lettered as
  ``SCHEMA_INVALID``);
* :func:`check_outgoing` validates a payload for the producer API, before anything is
  written (``SCHEMA_INVALID``, ``UNDECLARED_EVENT``);
* :func:`handler_routes` builds a handler service's routing table from the handler
  references the manifests name.

:func:`active_registry` is the process's registry: the file ``FERRY_REGISTRY`` names (read
here as well as by the settings, so that the producer API of a service that builds no
Ferry settings follows it too), else the shipped one; :func:`use_registry` replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from shared.contracts.fastcheck import Check, compile_check
from shared.contracts.layout import SHIPPED_REGISTRY
from shared.contracts.manifests import DeclaredEvent, event_specs, missing_contexts
from shared.contracts.registry_file import Registry, read_registry
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError, OutboxValidationError

#: The attribute ``services.handlers.service.one_statement`` sets on a route that
#: returns its effect as one statement (``ferry registry check`` accepts both forms).
ONE_STATEMENT_MARK = "__ferry_one_statement__"

#: At most this many schema violations are named in one error (the rest are counted).
MAX_REPORTED = 5
#: A violation's text is cut to this many characters (a huge instance would swamp it).
MAX_MESSAGE = 200

EventKey = tuple[str, int]


#: The environment variable naming the registry file (``CommonSettings.registry``).
REGISTRY_VARIABLE = "FERRY_REGISTRY"

_ACTIVE: Registry | None = None
#: Registry files read so far, by resolved path, with the (mtime, size) they had.
_READ: dict[Path, tuple[tuple[int, int], Registry]] = {}


def registry_path() -> Path:
    """The registry file of this process: ``FERRY_REGISTRY`` if set, else the shipped one."""
    named = os.environ.get(REGISTRY_VARIABLE, "").strip()
    return Path(named) if named else SHIPPED_REGISTRY


def load_registry(path: Path | str | None = None) -> Registry:
    """The registry in ``path`` (default: :func:`registry_path`), read once per file version."""
    target = Path(path) if path is not None else registry_path()
    try:
        stat = target.stat()
        key, version = target.resolve(), (stat.st_mtime_ns, stat.st_size)
    except OSError as exc:
        raise ConfigurationError(
            f"{target}: cannot read the registry file: {exc.strerror or exc}"
            + (
                f" (set by {REGISTRY_VARIABLE})"
                if path is None and target != SHIPPED_REGISTRY
                else ""
            )
        ) from None
    cached = _READ.get(key)
    if cached is not None and cached[0] == version:
        return cached[1]
    registry = read_registry(target)
    _READ[key] = (version, registry)
    return registry


def active_registry() -> Registry:
    """The process's registry: the one :func:`use_registry` set, else :func:`load_registry`."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = load_registry()
    return _ACTIVE


def use_registry(registry: Registry | Path | str | None) -> Registry | None:
    """Make ``registry`` (or the file it names) the process's; None: resolve it again on
    next use. Returns the previous one (tests put it back)."""
    global _ACTIVE
    previous = _ACTIVE
    _ACTIVE = (
        registry if registry is None or isinstance(registry, Registry) else load_registry(registry)
    )
    return previous


def declared_events(
    topology_name: str, registry: Registry | None = None
) -> tuple[DeclaredEvent, ...]:
    """The events the registry holds for the topology called ``topology_name``."""
    return (registry or active_registry()).declared(topology_name)


def attach_events(topology: Topology, *, source: str, registry: Registry | None = None) -> Topology:
    """``topology`` with its declared events (``handled_by`` worked out from its durables)."""
    registry = registry or active_registry()
    events = declared_events(topology.name, registry)
    missing = missing_contexts(topology, events)
    if missing:
        raise ConfigurationError(
            f"{source}: contexts: the registry's events for topology {topology.name!r} "
            f"({registry.source}) name context(s) {', '.join(missing)}, which this file lacks"
        )
    return topology.model_copy(update={"events": event_specs(topology, events)})


# --- payload validation -------------------------------------------------------------------


def _validator(schema: Mapping[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema)


def _fits(fast: Check | None, validator: Draft202012Validator, payload: object) -> bool:
    """Whether ``payload`` is valid: the compiled predicate's yes (:mod:`fastcheck`), else
    jsonschema's verdict (the predicate may only be unsure, never wrong)."""
    if fast is not None:
        try:
            if fast(payload):
                return True
        except Exception:
            pass  # unsure: jsonschema decides
    return bool(validator.is_valid(payload))


def payload_problems(validator: Draft202012Validator, payload: object) -> list[str]:
    """Every violation of ``payload``, each naming its path (``payload.owner_id: ...``)."""
    errors = sorted(
        validator.iter_errors(payload), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    )
    return [_describe(error) for error in errors]


def _describe(error: ValidationError) -> str:
    path = "payload" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    required = error.validator_value
    if error.validator == "required" and isinstance(error.instance, dict):
        for name in required if isinstance(required, list) else []:
            if name not in error.instance and error.message.startswith(repr(name)):
                return f"{path}.{name}: required property is missing"
    message = error.message
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return f"{path}: {message}"


def summarize(problems: list[str]) -> str:
    """``problems`` joined, the first :data:`MAX_REPORTED` named and the rest counted."""
    shown = "; ".join(problems[:MAX_REPORTED])
    extra = len(problems) - MAX_REPORTED
    return shown + (f" (and {extra} more)" if extra > 0 else "")


class AcceptedEvents(frozenset[EventKey]):
    """The (type, version) pairs a durable handles, each with its payload validator."""

    validators: dict[EventKey, Draft202012Validator]
    #: Each schema's fast predicate (:func:`compile_check`; None: jsonschema alone).
    fast_checks: dict[EventKey, Check | None]

    def __new__(cls, schemas: Mapping[EventKey, Mapping[str, Any] | None]) -> AcceptedEvents:
        accepted = super().__new__(cls, schemas)
        accepted.validators = {
            key: _validator(schema) for key, schema in schemas.items() if schema is not None
        }
        accepted.fast_checks = {
            key: compile_check(schema) for key, schema in schemas.items() if schema is not None
        }
        return accepted

    def payload_error(self, key: EventKey, payload: object) -> str | None:
        """None if ``payload`` fits the schema of ``key``, else what is wrong and where."""
        validator = self.validators.get(key)
        if validator is None or _fits(self.fast_checks.get(key), validator, payload):
            return None
        event_type, version = key
        problems = payload_problems(validator, payload)
        return f"{event_type}.v{version}: {summarize(problems)}"


def accepted_events(topology: Topology, durable: str) -> AcceptedEvents | None:
    """What ``durable`` handles (with validators); None when the topology declares nothing."""
    events = [e for e in topology.events if durable in e.handled_by]
    if not events:
        return None
    return AcceptedEvents({(e.type, e.version): e.payload_schema for e in events})


# --- the producer side --------------------------------------------------------------------


#: Validators of outgoing payloads and their fast predicates, by schema fingerprint (built
#: on first use).
_OUTGOING: dict[str, tuple[Draft202012Validator, Check | None]] = {}


def _outgoing_validator(event: DeclaredEvent) -> tuple[Draft202012Validator, Check | None]:
    found = _OUTGOING.get(event.fingerprint)
    if found is None:
        found = _OUTGOING[event.fingerprint] = (
            _validator(event.schema),
            compile_check(event.schema),
        )
    return found


def _declarations(event_type: str, version: int) -> list[tuple[str, DeclaredEvent]]:
    return [
        (topology, event)
        for topology, event in active_registry().all_events()
        if (event.type, event.version) == (event_type, version)
    ]


def check_outgoing(
    event_type: str, version: int, payload: object, *, context: str | None = None
) -> None:
    """Raise :class:`OutboxValidationError` unless the manifests declare the event and
    ``payload`` fits its schema. ``context`` (the producing context) narrows the lookup;
    without it the event must be declared once, or identically everywhere.
    """
    found = _declarations(event_type, version)
    if context is not None:
        found = [(t, e) for t, e in found if e.producer == context]
    if not found:
        raise OutboxValidationError(
            "UNDECLARED_EVENT", "event_type", _undeclared(event_type, version, context)
        )
    if len({e.fingerprint for _, e in found}) > 1:
        producers = ", ".join(sorted({f"{e.producer} ({t})" for t, e in found}))
        raise OutboxValidationError(
            "UNDECLARED_EVENT",
            "context",
            f"{event_type}.v{version} is declared with different schemas by {producers}: "
            "pass context= to say which one this is",
        )
    event = found[0][1]
    validator, fast = _outgoing_validator(event)
    if _fits(fast, validator, payload):
        return
    problems = payload_problems(validator, payload)
    raise OutboxValidationError(
        "SCHEMA_INVALID",
        "payload",
        f"{event_type}.v{version} of context {event.producer}: {summarize(problems)}",
    )


def _undeclared(event_type: str, version: int, context: str | None) -> str:
    versions = sorted(
        {
            e.version
            for _, e in active_registry().all_events()
            if e.type == event_type and (context is None or e.producer == context)
        }
    )
    where = f"context {context}'s manifest" if context else "no manifest"
    if context:
        head = f"{event_type}.v{version} is not declared in {where}"
    else:
        head = f"{event_type}.v{version} is declared by {where}"
    if versions:
        return head + f" (declared versions: {', '.join(f'v{v}' for v in versions)})"
    return head + (
        f" (registry {active_registry().source}: add it to the manifests, "
        "`ferry registry generate` and restart)"
    )


# --- the handler side ---------------------------------------------------------------------


def handler_routes(module: str, namespace: Mapping[str, Any]) -> dict[EventKey, Callable[..., Any]]:
    """Routes of a handler module: every (type, version) whose manifest names a function of
    ``module`` as its handler, mapped to that function as found in ``namespace``.

    A reference to a function the module lacks is left out (the service then refuses to
    start for the missing route, and ``ferry registry check`` names it).
    """
    routes: dict[EventKey, Callable[..., Any]] = {}
    for _, event in sorted(_all_events(), key=lambda item: item[0]):
        for binding in event.handlers:
            ref_module, _, function = binding.handler.partition(":")
            target = namespace.get(function)
            if ref_module != module or not callable(target):
                continue
            key = (event.type, event.version)
            if routes.setdefault(key, target) is not target:
                raise ConfigurationError(
                    f"{binding.manifest}: handles.{event.producer}.{event.name}.handler: "
                    f"{module} is named for {event.name} with two different functions"
                )
    return routes


def _all_events() -> Iterable[tuple[tuple[str, str, str, int], DeclaredEvent]]:
    for topology, event in active_registry().all_events():
        yield (topology, event.producer, event.type, event.version), event
