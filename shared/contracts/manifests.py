"""Event manifests: what each context publishes and handles, declared once (REQ-057, REQ-060).

One file per context of a topology, ``manifests/<topology>/<context>.yaml``::

    context: vibespro            # must match the file name and a context of the topology
    publishes:                   # the events this context produces
      - type: vibe_created
        version: 2
        description: A vibe was created, with its owner.
        ordering_key: vibe_id    # optional: the payload field (dotted path) whose value is
                                 # the ordering key (default: the aggregate)
        schema:                  # JSON Schema, draft 2020-12, of the payload (an object)
          $schema: https://json-schema.org/draft/2020-12/schema
          type: object
          required: [vibe_id, title, owner_id]
          properties: {...}
    handles:                     # the events this context consumes, and the handler of each
      - producer: sea
        type: model_published
        version: 1
        handler: services.handlers.contexts.vibespro:model_published_v1

An event's handling contexts are the contexts whose manifests list it under ``handles``.
``ferry registry generate`` compiles the manifests into a registry file
(:mod:`shared.contracts.registry_file`) and locks each version's schema fingerprint in
``manifests/schemas.lock``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from shared.contracts.lint import Problem
from shared.contracts.topology import EventSpec, Topology, load_yaml_mapping
from shared.domain.errors import ConfigurationError
from shared.domain.subjects import MAX_EVENT_VERSION, SNAKE_CASE

#: The only JSON Schema dialect manifests use (``$schema`` may name it or be left out).
DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Keywords that only document a schema: changing them never changes which payloads pass,
#: so they are left out of the fingerprint (a typo fix needs no new version).
ANNOTATIONS = frozenset({"title", "description", "$comment", "examples"})
#: Keywords whose value is a map of subschemas / a list of them / one subschema.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_ONE = frozenset(
    {
        "not", "if", "then", "else", "items", "contains", "additionalProperties",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
    }
)  # fmt: skip
#: A dotted path of payload field names (``config_id``, ``target.id``).
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_HANDLER_REF = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


# --- compiled form (what the registry file holds) ------------------------------------


@dataclass(frozen=True, slots=True)
class HandlerBinding:
    """A context that handles an event, its handler, and the manifest that says so."""

    context: str
    handler: str
    manifest: str


@dataclass(frozen=True, slots=True)
class DeclaredEvent:
    """One published event version with its schema and every handler of it."""

    producer: str
    type: str
    version: int
    fingerprint: str
    manifest: str
    schema: Mapping[str, Any]
    handlers: tuple[HandlerBinding, ...] = ()
    description: str = ""
    #: The payload field (dotted path) whose value is the event's ordering key; None: its
    #: aggregate. Not a schema constraint: it is not part of the fingerprint.
    ordering_key: str | None = None

    @property
    def name(self) -> str:
        """``type.vN``."""
        return f"{self.type}.v{self.version}"

    @property
    def key(self) -> tuple[str, str, int]:
        """(producer, type, version): unique within a topology."""
        return (self.producer, self.type, self.version)


# --- file models --------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PublishedEvent(_Model):
    """An event version a context publishes."""

    type: str
    version: int = Field(ge=1, le=MAX_EVENT_VERSION)
    description: str = ""
    payload_schema: dict[str, Any] = Field(alias="schema")
    #: The payload field (dotted path) whose value orders the event's handling on durables
    #: declared ``ordering: key``; default: the aggregate (``aggregate_type/aggregate_id``).
    ordering_key: str | None = None

    @model_validator(mode="after")
    def _check(self) -> PublishedEvent:
        if not SNAKE_CASE.match(self.type):
            raise ValueError(f"event type {self.type!r} must be snake_case")
        check_schema(self.payload_schema)
        if self.ordering_key is not None and not _FIELD_PATH.match(self.ordering_key):
            raise ValueError(
                f"ordering_key {self.ordering_key!r} must be a payload field name or a dotted "
                "path of them (config_id, target.id)"
            )
        return self


class HandledEvent(_Model):
    """An event version a context handles, and the handler that does it."""

    producer: str
    type: str
    version: int = Field(ge=1, le=MAX_EVENT_VERSION)
    #: ``package.module:function`` of the route that applies it.
    handler: str

    @model_validator(mode="after")
    def _check(self) -> HandledEvent:
        if not _HANDLER_REF.match(self.handler):
            raise ValueError(
                f"handler {self.handler!r} must be a reference like package.module:function"
            )
        return self


class ManifestFile(_Model):
    """One context's manifest."""

    context: str
    publishes: list[PublishedEvent] = Field(default_factory=list)
    handles: list[HandledEvent] = Field(default_factory=list)

    @field_validator("publishes")
    @classmethod
    def _unique_publishes(cls, value: list[PublishedEvent]) -> list[PublishedEvent]:
        _no_duplicates([(e.type, e.version) for e in value])
        return value

    @field_validator("handles")
    @classmethod
    def _unique_handles(cls, value: list[HandledEvent]) -> list[HandledEvent]:
        _no_duplicates([(h.producer, h.type, h.version) for h in value])
        return value


def _no_duplicates(keys: list[tuple[Any, ...]]) -> None:
    seen: set[tuple[Any, ...]] = set()
    for key in keys:
        if key in seen:
            shown = ".".join(str(k) for k in key[:-1]) + f".v{key[-1]}"
            raise ValueError(f"{shown} is declared twice")
        seen.add(key)


def check_schema(schema: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``schema`` is a valid draft 2020-12 schema of an object."""
    dialect = schema.get("$schema", DIALECT)
    if dialect != DIALECT:
        raise ValueError(f"schema: $schema must be {DIALECT} (draft 2020-12), not {dialect!r}")
    if validator_for(schema, default=Draft202012Validator) is not Draft202012Validator:
        raise ValueError("schema: only draft 2020-12 is supported")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        raise ValueError(f"schema{'.' + where if where else ''}: {exc.message}") from None
    if schema.get("type") != "object":
        raise ValueError("schema: a payload is a JSON object: the schema needs type: object")


# --- fingerprints -------------------------------------------------------------------------


def constraints(schema: Any) -> Any:
    """``schema`` without its annotation keywords, at every schema position."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: constraints(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [constraints(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            out[key] = constraints(value)
        else:
            out[key] = value
    return out


def fingerprint(schema: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the schema's constraints in canonical JSON (key order ignored)."""
    canonical = json.dumps(
        constraints(dict(schema)), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# --- loading and compiling ----------------------------------------------------------------


@dataclass
class ManifestSet:
    """Every manifest of one topology, by context, with the label of its file."""

    topology: str
    files: dict[str, tuple[str, ManifestFile]] = field(default_factory=dict)


def load_manifest_set(directory: Path, *, label_root: Path | None = None) -> ManifestSet:
    """Read ``directory/*.yaml`` (one topology's manifests); errors name file and field."""
    errors: list[str] = []
    found = ManifestSet(directory.name)
    for path in sorted(directory.glob("*.yaml")):
        label = _label(path, label_root)
        try:
            manifest = _load_file(path, label)
        except ConfigurationError as exc:
            errors.append(str(exc))
            continue
        if manifest.context != path.stem:
            errors.append(
                f"{label}: context: {manifest.context!r} does not match the file name "
                f"(expected {path.stem!r})"
            )
            continue
        found.files[manifest.context] = (label, manifest)
    if errors:
        raise ConfigurationError("\n".join(errors))
    return found


def _label(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(path.relative_to(root))
        except ValueError:
            pass
    return str(path)


def _load_file(path: Path, label: str) -> ManifestFile:
    raw = load_yaml_mapping(path, label, "manifest")
    try:
        return ManifestFile.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = _where(raw, error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"{label}: {where}: {message}")
        raise ConfigurationError("\n".join(lines)) from None


def _where(raw: dict[str, Any], loc: tuple[int | str, ...]) -> str:
    """A field path naming list entries by event (``publishes.vibe_created.v2.schema``)."""
    parts: list[str] = []
    node: Any = raw
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            entry = node[part]
            node = entry
            if isinstance(entry, dict) and "type" in entry and "version" in entry:
                prefix = f"{entry['producer']}." if "producer" in entry else ""
                parts.append(f"{prefix}{entry['type']}.v{entry['version']}")
                continue
            parts.append(f"[{part}]")
            continue
        node = node.get(part) if isinstance(node, dict) else None
        parts.append(str(part))
    return ".".join(parts).replace(".[", "[") or "(top level)"


def compile_manifests(
    manifests: ManifestSet, topology: Topology | None = None, *, topology_source: str = ""
) -> tuple[list[DeclaredEvent], list[Problem]]:
    """Published events with their handlers, stably ordered, and what does not add up.

    Problems: a manifest for a context the topology lacks (``unknown-context``), and a
    handler for an event no manifest publishes (``unpublished-event``).
    """
    problems: list[Problem] = []
    if topology is not None:
        for context, (label, _) in sorted(manifests.files.items()):
            if context not in topology.contexts:
                known = ", ".join(sorted(topology.contexts))
                problems.append(
                    Problem(
                        label,
                        "context",
                        "unknown-context",
                        f"topology {topology.name!r} ({topology_source or 'its file'}) has no "
                        f"context {context!r} (known: {known})",
                    )
                )
    published = {
        (context, event.type, event.version): (label, event)
        for context, (label, manifest) in manifests.files.items()
        for event in manifest.publishes
    }
    bindings: dict[tuple[str, str, int], list[HandlerBinding]] = {}
    for context, (label, manifest) in sorted(manifests.files.items()):
        for handled in manifest.handles:
            key = (handled.producer, handled.type, handled.version)
            if key not in published:
                problems.append(_unpublished(label, context, handled, published))
                continue
            bindings.setdefault(key, []).append(HandlerBinding(context, handled.handler, label))
    events = [
        DeclaredEvent(
            producer=key[0],
            type=key[1],
            version=key[2],
            fingerprint=fingerprint(event.payload_schema),
            manifest=label,
            schema=event.payload_schema,
            handlers=tuple(sorted(bindings.get(key, []), key=lambda b: (b.context, b.handler))),
            description=event.description,
            ordering_key=event.ordering_key,
        )
        for key, (label, event) in sorted(published.items())
    ]
    return events, problems


def _unpublished(
    label: str,
    context: str,
    handled: HandledEvent,
    published: Mapping[tuple[str, str, int], object],
) -> Problem:
    offered = sorted(f"{t}.v{v}" for p, t, v in published if p == handled.producer)
    listing = ", ".join(offered) if offered else "nothing"
    return Problem(
        label,
        f"handles.{handled.producer}.{handled.type}.v{handled.version}",
        "unpublished-event",
        f"context {context} handles {handled.type} v{handled.version} of context "
        f"{handled.producer}, but no manifest publishes it ({handled.producer} publishes: "
        f"{listing})",
    )


# --- the deployment's view ----------------------------------------------------------------


def event_specs(topology: Topology, events: Iterable[DeclaredEvent]) -> list[EventSpec]:
    """``events`` as :class:`EventSpec` of ``topology``, ``handled_by`` from its durables.

    A durable delivers an event when it reads the producer's stream, targets a handling
    context and one of its filters covers the event's subject.
    """
    specs = []
    for event in events:
        producer = topology.contexts[event.producer]
        subject = f"{producer.namespace}.{event.type}.v{event.version}"
        handlers = {b.context: b.handler for b in event.handlers}
        handled_by = sorted(
            name
            for name, durable in topology.durables.items()
            if producer.stream is not None
            and durable.stream == producer.stream.name
            and durable.target in handlers
            and topology.delivers(name, subject)
        )
        specs.append(
            EventSpec.model_validate(
                {
                    "context": event.producer,
                    "type": event.type,
                    "version": event.version,
                    "schema": dict(event.schema),
                    "handled_by": handled_by,
                    "handlers": handlers,
                    "manifest": event.manifest,
                    "fingerprint": event.fingerprint,
                    "ordering_key": event.ordering_key,
                    "description": event.description,
                }
            )
        )
    return specs


def missing_contexts(topology: Topology, events: Iterable[DeclaredEvent]) -> list[str]:
    """Contexts the events name (as producer or handler) that ``topology`` lacks."""
    named = set()
    for event in events:
        named.add(event.producer)
        named.update(b.context for b in event.handlers)
    return sorted(named - set(topology.contexts))
