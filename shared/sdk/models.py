"""Pydantic models for the payloads a handler receives, generated from their JSON Schemas.

``ferry handler-models CONTEXT --out payloads.py`` writes, for each event the topology
sends to CONTEXT, a model class (``VibeCreatedV2`` for ``vibe_created`` v2), and two
tables a :class:`~shared.sdk.handler.Handler` takes as they are: ``MODELS`` (key → model)
and ``SCHEMAS`` (key → the JSON Schema, which the handler checks first with jsonschema,
the validator the consumer uses).

The models type the payload; they do not validate it a second time. So they follow the
schema's *shape* — ``type`` (and lists of types), ``properties`` / ``required`` (nested
objects become nested models), ``items``, ``enum`` / ``const`` (``Literal``),
``anyOf`` / ``oneOf`` (unions), ``additionalProperties`` (``false`` forbids extra fields,
a schema types a map), ``description`` — while constraints (``minimum``, ``maxLength``,
``pattern``, ``format``...) are left to jsonschema, which enforces them all (``format``
as an annotation, as the consumer does: a ``date-time`` stays a ``str``, so the model
never refuses what the consumer accepted). What has no plain Python shape (``allOf``,
``$ref``, ``not``, ``if``) is typed ``Any``.

Why our own generator rather than datamodel-code-generator: the manifests use a small,
plain subset; the output here is deterministic (no timestamp, no formatter, the same on
every machine, so a CI job can diff it), it types without re-validating (that tool emits
constraints as pydantic validators, a second validator with other words and edge cases,
e.g. on ``format``), it carries the schemas beside the models, and it adds no dependency
(with its formatter and templating chain) to a team's build.
"""

from __future__ import annotations

import keyword
import pprint
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

_SCALARS = (str, int, bool, type(None))
_PRIMITIVES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
}


@dataclass(frozen=True, slots=True)
class EventSchema:
    """One event version's payload schema."""

    event_type: str
    version: int
    schema: Mapping[str, Any]
    description: str = ""


def class_name(event_type: str, version: int) -> str:
    """``vibe_created``, 2 → ``VibeCreatedV2``."""
    return _camel(event_type) + f"V{version}"


def _camel(text: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", text) if w]
    name = "".join(w[:1].upper() + w[1:] for w in words) or "Field"
    return name if name[0].isalpha() else "F" + name


def python_name(name: str, taken: set[str]) -> str:
    """A field name pydantic accepts for the JSON member ``name`` (then an alias)."""
    candidate = re.sub(r"[^0-9A-Za-z_]", "_", name).lstrip("_") or "field"
    if candidate[0].isdigit():
        candidate = "f_" + candidate
    if (
        keyword.iskeyword(candidate)
        or candidate.startswith("model_")
        or hasattr(BaseModel, candidate)
    ):
        candidate += "_"
    base, n = candidate, 2
    while candidate in taken:
        candidate, n = f"{base}_{n}", n + 1
    taken.add(candidate)
    return candidate


@dataclass
class _Writer:
    classes: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)

    def unique(self, name: str) -> str:
        base, n = name, 2
        while name in self.names:
            name, n = f"{base}{n}", n + 1
        self.names.add(name)
        return name

    def type_of(self, schema: object, hint: str) -> str:
        """The annotation for ``schema``; nested object models are written on the way."""
        if not isinstance(schema, Mapping):
            return "Any"
        if "const" in schema:
            return _literal([schema["const"]])
        if "enum" in schema and isinstance(schema["enum"], list):
            return _literal(schema["enum"])
        for word in ("anyOf", "oneOf"):
            if isinstance(schema.get(word), list):
                branches = [self.type_of(b, hint) for b in schema[word]]
                return _union(branches)
        declared = schema.get("type")
        if isinstance(declared, list):
            return _union([self.type_of({**schema, "type": t}, hint) for t in declared])
        if declared in _PRIMITIVES:
            return _PRIMITIVES[declared]
        if declared == "array":
            return f"list[{self.type_of(schema.get('items', {}), hint + 'Item')}]"
        if declared == "object" or "properties" in schema:
            return self.object_type(schema, hint)
        return "Any"

    def object_type(self, schema: Mapping[str, Any], hint: str) -> str:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, Mapping) or not properties:
            if isinstance(extra, Mapping):
                return f"dict[str, {self.type_of(extra, hint + 'Value')}]"
            return "dict[str, Any]"
        return self.model(schema, hint)

    def model(self, schema: Mapping[str, Any], name: str, description: str = "") -> str:
        """Write a model class for an object schema; its name."""
        name = self.unique(name)
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        forbid = schema.get("additionalProperties") is False
        lines = [f"class {name}(BaseModel):"]
        doc = description or str(schema.get("description") or "")
        if doc:
            lines.append(f"    {_docstring(doc)}")
            lines.append("")
        extra = "forbid" if forbid else "allow"
        lines.append(f'    model_config = ConfigDict(extra="{extra}", frozen=True)')
        taken: set[str] = set()
        fields = []
        for member, sub in properties.items():
            py = python_name(member, taken)
            annotation = self.type_of(sub, name + _camel(member))
            options = []
            if py != member:
                options.append(f"alias={member!r}")
            text = sub.get("description") if isinstance(sub, Mapping) else None
            if text:
                options.append(f"description={str(text)!r}")
            if member not in required:
                if annotation != "Any" and "None" not in annotation.split(" | "):
                    annotation += " | None"
                options.insert(0, "default=None")
            value = f" = Field({', '.join(options)})" if options else ""
            fields.append(f"    {py}: {annotation}{value}")
        lines.extend(fields)
        self.classes.append("\n".join(lines))
        return name


def _docstring(text: str) -> str:
    return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"').strip() + '"""'


def _literal(values: list[Any]) -> str:
    if not values or not all(isinstance(v, _SCALARS) for v in values):
        return "Any"
    present = [v for v in values if v is not None]
    parts = [f"Literal[{', '.join(repr(v) for v in present)}]"] if present else []
    if len(present) < len(values):
        parts.append("None")
    return " | ".join(parts)


def _union(branches: list[str]) -> str:
    if "Any" in branches:
        return "Any"
    seen: list[str] = []
    for branch in branches:
        for part in branch.split(" | "):
            if part not in seen:
                seen.append(part)
    return " | ".join(seen)


def generate_models(events: Iterable[EventSchema], *, source: str) -> str:
    """The Python module (source text) for ``events``, in a stable order."""
    writer = _Writer()
    entries = []
    for event in sorted(events, key=lambda e: (e.event_type, e.version)):
        hint = class_name(event.event_type, event.version)
        name = writer.model(event.schema, hint, event.description)
        entries.append((event, name))
    models = "\n".join(f"    ({e.event_type!r}, {e.version}): {n}," for e, n in entries)
    schemas = "\n".join(
        f"    ({e.event_type!r}, {e.version}): "
        + pprint.pformat(dict(e.schema), width=90, sort_dicts=False).replace("\n", "\n    ")
        + ","
        for e, _ in entries
    )
    body = "\n\n\n".join(writer.classes)
    typing_names = [n for n in ("Any", "Literal") if n == "Any" or f"{n}[" in body]
    pydantic_names = ["BaseModel", "ConfigDict", *(["Field"] if "Field(" in body else [])]
    head = (
        '"""Payload models generated by ``ferry handler-models`` (shared/sdk/models.py) from\n'
        f'{source}: do not edit; generate again when a manifest changes."""\n\n'
        f"from typing import {', '.join(typing_names)}\n\n"
        f"from pydantic import {', '.join(pydantic_names)}\n"
    )
    tables = (
        "#: The model of each (event_type, version): Handler(models=MODELS).\n"
        f"MODELS: dict[tuple[str, int], type[BaseModel]] = {{\n{models}\n}}\n\n"
        "#: The JSON Schema of each (event_type, version): Handler(schemas=SCHEMAS).\n"
        f"SCHEMAS: dict[tuple[str, int], dict[str, Any]] = {{\n{schemas}\n}}\n"
    )
    return f"{head}\n\n{body}\n\n\n{tables}"
