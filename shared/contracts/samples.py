"""Payloads built from an event's JSON Schema: one it accepts, and one it refuses.

``ferry handler-check`` sends a handler an event its durable accepts and the same event
with a payload the schema refuses. :func:`sample_payload` takes the schema's first
valid ``examples`` entry, else builds the smallest object that satisfies it (required
properties only; strings unique per call, so repeated runs do not collide on a
handler's own unique keys). :func:`poison_payload` derives from a valid payload one the
schema refuses (a required property removed, a property of the wrong type, an
undeclared property where none is allowed). Both check what they build with the
registry's own validator (Draft 2020-12): a schema they cannot satisfy — a ``pattern``
the sample does not match, contradictory bounds — is a :class:`SampleError` naming the
path, and the caller asks for an example instead.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from jsonschema import Draft202012Validator

from shared.domain.errors import FerryError

#: Deepest schema nesting followed ($ref cycles end here).
MAX_DEPTH = 32
#: Values for string formats a token would not satisfy.
_FORMATS: dict[str, Any] = {
    "date": lambda: datetime.now(UTC).date().isoformat(),
    "time": lambda: "12:00:00Z",
    "date-time": lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    "email": lambda: f"handler-check-{uuid.uuid4().hex[:8]}@example.com",
    "uri": lambda: f"https://example.com/handler-check/{uuid.uuid4().hex[:8]}",
    "hostname": lambda: "handler-check.example.com",
    "ipv4": lambda: "192.0.2.1",
    "ipv6": lambda: "2001:db8::1",
    "uuid": lambda: str(uuid.uuid4()),
}
#: Wrong-typed values tried on a property when building a poison payload.
_WRONG_VALUES: tuple[Any, ...] = (
    {"handler_check": "wrong type"},
    ["wrong type"],
    "wrong type",
    0.5,
)
#: The property added to an object that allows no undeclared ones.
UNEXPECTED_PROPERTY = "handler_check_unexpected"


class SampleError(FerryError):
    """The schema cannot be satisfied by a built sample (names the path and why)."""


def sample_payload(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON object ``schema`` accepts: its first valid example, else a built one."""
    validator = Draft202012Validator(dict(schema))
    for example in schema.get("examples") or ():
        if isinstance(example, dict) and validator.is_valid(example):
            return example
    value = _Builder(validator).build(schema, "payload", 0)
    if not isinstance(value, dict):
        raise SampleError(f"payload: the schema does not describe an object ({value!r} built)")
    problem = next(iter(validator.iter_errors(value)), None)
    if problem is not None:
        where = "payload" + "".join(f".{p}" for p in problem.absolute_path)
        raise SampleError(f"{where}: cannot build a value the schema accepts ({problem.message})")
    return value


def poison_payload(schema: Mapping[str, Any], valid: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON object ``schema`` refuses, derived from ``valid``; None when it accepts every
    object (nothing can be poison by schema)."""
    validator = Draft202012Validator(dict(schema))
    for candidate in _poison_candidates(schema, dict(valid)):
        if not validator.is_valid(candidate):
            return candidate
    return None


def _poison_candidates(
    schema: Mapping[str, Any], valid: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    required = schema.get("required")
    for name in required if isinstance(required, list) else ():
        if name in valid:
            yield {k: v for k, v in valid.items() if k != name}
    properties = schema.get("properties")
    names = [*valid, *(properties if isinstance(properties, dict) else ())]
    for name in dict.fromkeys(names):
        for wrong in _WRONG_VALUES:
            yield {**valid, name: wrong}
    yield {**valid, UNEXPECTED_PROPERTY: True}


class _Builder:
    """Builds a value for a (sub)schema; refs resolve against the root validator."""

    def __init__(self, root: Draft202012Validator) -> None:
        self.root = root

    def valid(self, schema: Any, value: Any) -> bool:
        return bool(self.root.evolve(schema=schema).is_valid(value))

    def build(self, schema: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SampleError(f"{path}: the schema nests deeper than {MAX_DEPTH} levels")
        if schema is True or schema == {}:
            return "handler-check"
        if schema is False:
            raise SampleError(f"{path}: the schema accepts nothing")
        if not isinstance(schema, Mapping):
            raise SampleError(f"{path}: not a schema: {schema!r}")
        schema = self._resolved(schema, path)
        for known in self._known_values(schema):
            if self.valid(schema, known):
                return known
        for branches in ("anyOf", "oneOf"):
            if isinstance(schema.get(branches), list):
                return self._branch(schema, branches, path, depth)
        if isinstance(schema.get("allOf"), list):
            return self.build(_merged(schema), path, depth + 1)
        return self._typed(schema, path, depth)

    def _resolved(self, schema: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            return schema
        target = _pointer(self.root.schema, ref)
        if target is None:
            raise SampleError(f"{path}: cannot resolve $ref {ref!r} (only #/... within the schema)")
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {**target, **rest} if isinstance(target, Mapping) else rest

    @staticmethod
    def _known_values(schema: Mapping[str, Any]) -> Iterator[Any]:
        if "const" in schema:
            yield schema["const"]
        if isinstance(schema.get("enum"), list):
            yield from schema["enum"]
        yield from schema.get("examples") or ()
        if "default" in schema:
            yield schema["default"]

    def _branch(self, schema: Mapping[str, Any], key: str, path: str, depth: int) -> Any:
        rest = {k: v for k, v in schema.items() if k != key}
        last: SampleError | None = None
        for branch in schema[key]:
            merged = {**rest, **branch} if isinstance(branch, Mapping) else branch
            try:
                value = self.build(merged, path, depth + 1)
            except SampleError as exc:
                last = exc
                continue
            if self.valid(schema, value):
                return value
        raise last or SampleError(f"{path}: no branch of {key} could be satisfied")

    def _typed(self, schema: Mapping[str, Any], path: str, depth: int) -> Any:
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, path, depth)
        if kind == "array":
            return self._array(schema, path, depth)
        if kind in ("integer", "number"):
            return _number(schema, path, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return _string(schema, path)

    def _object(self, schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        properties = _mapping(schema.get("properties"))
        names = list(dict.fromkeys(_sequence(schema.get("required"))))
        wanted = schema.get("minProperties", 0)
        for name in properties:
            if len(names) >= wanted:
                break
            if name not in names:
                names.append(name)
        extra = schema.get("additionalProperties", True)
        return {
            name: self.build(properties.get(name, extra), f"{path}.{name}", depth + 1)
            for name in names
        }

    def _array(self, schema: Mapping[str, Any], path: str, depth: int) -> list[Any]:
        prefix = _sequence(schema.get("prefixItems"))
        items = schema.get("items", True)
        count = int(schema.get("minItems", 0))
        return [
            self.build(prefix[i] if i < len(prefix) else items, f"{path}[{i}]", depth + 1)
            for i in range(count)
        ]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _pointer(root: Any, ref: str) -> Any:
    """The part of ``root`` a local ``$ref`` (``#`` or ``#/a/b``) names; None otherwise."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _merged(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``allOf`` folded into one schema (properties merged, required joined)."""
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        if not isinstance(part, Mapping):
            continue
        for key, value in part.items():
            if key == "properties" and isinstance(value, dict):
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required" and isinstance(value, list):
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _kind(schema: Mapping[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        choices = [t for t in declared if t != "null"] or ["null"]
        declared = choices[0]
    if isinstance(declared, str):
        return declared
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "multipleOf")):
        return "number"
    return "string"


def _number(schema: Mapping[str, Any], path: str, *, integer: bool) -> int | float:
    low, high = _numeric(schema.get("minimum")), _numeric(schema.get("maximum"))
    above, below = (
        _numeric(schema.get("exclusiveMinimum")),
        _numeric(schema.get("exclusiveMaximum")),
    )
    gap = 1 if integer else 0.5
    floors = [v for v in (low, None if above is None else above + gap) if v is not None]
    ceilings = [v for v in (high, None if below is None else below - gap) if v is not None]
    start = max(floors) if floors else min([1, *ceilings])
    step = _numeric(schema.get("multipleOf"))
    if step is not None and step > 0:
        start = math.ceil(start / step) * step
    value: int | float = math.ceil(start) if integer else start
    if (high is not None and value > high) or (below is not None and value >= below):
        raise SampleError(f"{path}: no number fits the schema's bounds")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _numeric(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _string(schema: Mapping[str, Any], path: str) -> str:
    fmt = schema.get("format")
    value: str = _FORMATS[fmt]() if fmt in _FORMATS else f"hc-{uuid.uuid4().hex[:12]}"
    shortest = schema.get("minLength", 0)
    longest = schema.get("maxLength")
    if isinstance(shortest, int) and len(value) < shortest:
        value += "x" * (shortest - len(value))
    if isinstance(longest, int) and len(value) > longest and fmt not in _FORMATS:
        value = value[:longest]
    # A pattern cannot be inverted in general; the caller names the path and asks for an
    # example when the token does not match.
    if isinstance(schema.get("pattern"), str) and re.search(schema["pattern"], value) is None:
        raise SampleError(
            f"{path}: cannot build a string matching pattern {schema['pattern']!r}: "
            "add an examples entry to the schema"
        )
    return value
