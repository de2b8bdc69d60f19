"""The registry as a data file: what ``ferry registry generate`` writes and every role loads.

A registry is a JSON document (UTF-8, keys sorted, byte-identical for the same manifests)::

    {
      "format": "ferry-registry",
      "format_version": 1,
      "topologies": {                       # topology name -> its published event versions
        "sea-vibespro": [
          {
            "producer": "vibespro", "type": "vibe_created", "version": 2,
            "description": "...",
            "schema": {...},                # JSON Schema (draft 2020-12) of the payload
            "fingerprint": "sha256:...",    # of the schema's constraints (see manifests.py)
            "ordering_key": "vibe_id",      # only when the manifest names one
            "manifest": "manifests/sea-vibespro/vibespro.yaml",
            "handlers": [                   # the routes: who handles it, with what
              {"context": "sea", "handler": "pkg.module:function",
               "manifest": "manifests/sea-vibespro/sea.yaml"}
            ]
          }
        ]
      },
      "lock": {"sea-vibespro/vibespro/vibe_created.v2": "sha256:..."}
    }

``lock`` is the schema lock the file was generated with: every version ever published
under those manifests with its fingerprint. :func:`read_registry` refuses a file that is
not this (a clear :class:`ConfigurationError` naming the file and what is wrong, never
another exception): not JSON, another format or a newer ``format_version``, a missing or
unknown field, an invalid schema, an event whose schema does not fingerprint as the file
says or whose fingerprint differs from the lock (a file edited by hand or damaged).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from shared.contracts.manifests import (
    DeclaredEvent,
    HandlerBinding,
    check_schema,
    fingerprint,
)
from shared.domain.errors import ConfigurationError
from shared.domain.subjects import MAX_EVENT_VERSION, SNAKE_CASE

#: The value of ``format``: what the file is.
FORMAT = "ferry-registry"
#: The layout this Ferry writes and reads; a file of another version is refused.
FORMAT_VERSION = 1
#: At most this many problems are named in one error (the rest are counted).
MAX_REPORTED = 5
#: A registry file larger than this is refused before it is parsed.
MAX_BYTES = 64 * 1024 * 1024


def lock_key(topology: str, event: DeclaredEvent) -> str:
    """``topology/producer/type.vN``: the key of a version in the schema lock."""
    return f"{topology}/{event.producer}/{event.name}"


@dataclass(frozen=True)
class Registry:
    """Every topology's declared events, and the lock they were generated with."""

    #: Where it was read from (named in errors).
    source: str
    events: Mapping[str, tuple[DeclaredEvent, ...]] = field(default_factory=dict)
    lock: Mapping[str, str] = field(default_factory=dict)

    def declared(self, topology: str) -> tuple[DeclaredEvent, ...]:
        """The events declared for ``topology`` (none if it has no entry)."""
        return self.events.get(topology, ())

    def all_events(self) -> Iterable[tuple[str, DeclaredEvent]]:
        """(topology, event) for every event, topologies by name."""
        for topology in sorted(self.events):
            for event in self.events[topology]:
                yield topology, event


# --- the file's models --------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Handler(_Model):
    context: StrictStr
    handler: StrictStr
    manifest: StrictStr


class _Event(_Model):
    producer: StrictStr
    type: StrictStr
    version: StrictInt = Field(ge=1, le=MAX_EVENT_VERSION)
    description: StrictStr = ""
    payload_schema: dict[str, Any] = Field(alias="schema")
    fingerprint: StrictStr
    ordering_key: StrictStr | None = None
    manifest: StrictStr
    handlers: list[_Handler] = Field(default_factory=list)


class _File(_Model):
    format: Literal["ferry-registry"]
    format_version: Literal[1]
    topologies: dict[StrictStr, list[_Event]]
    lock: dict[StrictStr, StrictStr]


# --- writing ------------------------------------------------------------------------------


def _event_doc(event: DeclaredEvent) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "producer": event.producer,
        "type": event.type,
        "version": event.version,
        "description": event.description,
        "schema": event.schema,
        "fingerprint": event.fingerprint,
        "manifest": event.manifest,
        "handlers": [
            {"context": b.context, "handler": b.handler, "manifest": b.manifest}
            for b in event.handlers
        ],
    }
    if event.ordering_key is not None:
        doc["ordering_key"] = event.ordering_key
    return doc


def render_registry(events: Mapping[str, Iterable[DeclaredEvent]], lock: Mapping[str, str]) -> str:
    """The registry file's text: deterministic for given events and lock."""
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "topologies": {
            topology: [_event_doc(e) for e in sorted(events[topology], key=lambda e: e.key)]
            for topology in sorted(events)
        },
        "lock": dict(sorted(lock.items())),
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --- reading ------------------------------------------------------------------------------


def read_registry(path: Path | str) -> Registry:
    """Read and check a registry file; every problem is a :class:`ConfigurationError`."""
    label = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"{label}: cannot read the registry file: {exc.strerror or exc}"
        ) from None
    return parse_registry(data, label)


def parse_registry(data: bytes, label: str) -> Registry:
    """The registry in ``data`` (the content of the file ``label``), checked."""
    if len(data) > MAX_BYTES:
        raise ConfigurationError(
            f"{label}: {len(data)} bytes is larger than a registry file may be ({MAX_BYTES})"
        )
    raw = _decode(data, label)
    _check_header(raw, label)
    try:
        model = _File.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(_describe_errors(label, raw, exc)) from None
    except RecursionError:
        raise ConfigurationError(f"{label}: nested too deep to be a registry file") from None
    return _compile(model, label)


def _decode(data: bytes, label: str) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{label}: not a registry file: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{label}: not a registry file: not valid JSON ({exc.msg} at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except (RecursionError, ValueError) as exc:  # nesting, or an integer of 4,300+ digits
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)[:120]
        raise ConfigurationError(f"{label}: not a registry file: {reason}") from None


def _check_header(raw: Any, label: str) -> None:
    """Say first what kind of file it is, before any detail of its content."""
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"{label}: not a registry file: the top level must be a JSON object"
        )
    kind = raw.get("format")
    if kind != FORMAT:
        raise ConfigurationError(
            f"{label}: not a registry file: format is {_short_repr(kind)}, expected {FORMAT!r} "
            "(write one with `ferry registry generate --manifests DIR --out FILE`)"
        )
    version = raw.get("format_version")
    if type(version) is not int:
        raise ConfigurationError(
            f"{label}: format_version must be an integer, got {_short_repr(version)}"
        )
    if version != FORMAT_VERSION:
        newer = "a newer" if version > FORMAT_VERSION else "an older"
        raise ConfigurationError(
            f"{label}: format_version {version} was written by {newer} Ferry; this one reads "
            f"format_version {FORMAT_VERSION}: regenerate it with this Ferry's "
            "`ferry registry generate`"
        )


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_errors(label: str, raw: Any, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = _where(raw, error["loc"])
        lines.append(f"{label}: {where}: {error['msg']}")
    return _summary(lines)


def _where(raw: Any, loc: tuple[int | str, ...]) -> str:
    """A field path naming events by type and version where it can."""
    parts: list[str] = []
    node: Any = raw
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            node = node[part]
            if isinstance(node, dict) and isinstance(node.get("type"), str):
                version = node.get("version")
                shown = f"{node['type']}.v{version}" if type(version) is int else node["type"]
                parts.append(f"[{part}]({_short(shown)})")
            else:
                parts.append(f"[{part}]")
            continue
        node = node.get(part) if isinstance(node, dict) else None
        parts.append(f".{_short(str(part))}")
    return "".join(parts).lstrip(".") or "(top level)"


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _summary(lines: list[str]) -> str:
    extra = len(lines) - MAX_REPORTED
    shown = lines[:MAX_REPORTED]
    if extra > 0:
        shown.append(f"(and {extra} more)")
    return "\n".join(shown)


def _compile(model: _File, label: str) -> Registry:
    problems: list[str] = []
    events: dict[str, tuple[DeclaredEvent, ...]] = {}
    for topology, entries in sorted(model.topologies.items()):
        compiled: list[DeclaredEvent] = []
        seen: set[tuple[str, str, int]] = set()
        for index, entry in enumerate(entries):
            where = f"{label}: topologies.{_short(topology)}[{index}]({_short(entry.type)}.v"
            where += f"{entry.version})"
            problem = _event_problem(topology, entry, model.lock)
            key = (entry.producer, entry.type, entry.version)
            if problem is None and key in seen:
                problem = f"declared twice by {_short(entry.producer)}"
            if problem is not None:
                problems.append(f"{where}: {problem}")
                continue
            seen.add(key)
            compiled.append(_declared(entry))
        events[topology] = tuple(compiled)
    if problems:
        raise ConfigurationError(_summary(problems))
    return Registry(label, events, dict(model.lock))


def _event_problem(topology: str, entry: _Event, lock: Mapping[str, str]) -> str | None:
    if not SNAKE_CASE.match(entry.type):
        return f"event type {_short_repr(entry.type)} must be snake_case"
    try:
        check_schema(entry.payload_schema)
        actual = fingerprint(entry.payload_schema)
    except ValueError as exc:
        return f"invalid schema: {str(exc)[:300]}"
    except RecursionError:
        return "invalid schema: nested too deep"
    if actual != entry.fingerprint:
        return (
            f"the schema fingerprints as {actual[:19]}, but the file says "
            f"{_short(entry.fingerprint)}: the file was edited by hand or damaged; regenerate it"
        )
    key = f"{topology}/{entry.producer}/{entry.type}.v{entry.version}"
    locked = lock.get(key)
    if locked is None:
        return f"{_short(key)} is missing from the file's lock: regenerate the file"
    if locked != entry.fingerprint:
        return (
            f"the file's lock holds {_short(locked)} for {_short(key)}, but the event "
            f"fingerprints as {actual[:19]}: a published version never changes"
        )
    return None


def _declared(entry: _Event) -> DeclaredEvent:
    return DeclaredEvent(
        producer=entry.producer,
        type=entry.type,
        version=entry.version,
        fingerprint=entry.fingerprint,
        manifest=entry.manifest,
        schema=entry.payload_schema,
        handlers=tuple(HandlerBinding(h.context, h.handler, h.manifest) for h in entry.handlers),
        description=entry.description,
        ordering_key=entry.ordering_key,
    )
