"""A tiny validator for the JSON Schema subset the topology's event manifests use.

Supported keywords: ``type`` (object, string, number, integer, boolean, array, null, or
a list of them), ``required`` and ``properties`` (applied recursively to the properties
that are present). Annotation keywords (``title``, ``description``, ``$schema``...) are
allowed and ignored. Any other keyword is refused when the service starts
(:func:`check_supported`), because silently skipping ``enum`` or ``minimum`` would
accept payloads the manifest means to reject.

Failures raise :class:`PoisonError` (``SCHEMA_VIOLATION``) naming the field path, e.g.
``payload.owner_id: required field is missing``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.domain.errors import ConfigurationError, PoisonError

#: Keywords this validator enforces.
ENFORCED = frozenset({"type", "required", "properties"})
#: Keywords that describe rather than constrain, so ignoring them loses nothing.
ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "examples", "default"}
)


def _is_integer(value: object) -> bool:
    # JSON Schema counts 3.0 as an integer; bool is an int subclass but never one.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_TYPE_CHECKS: dict[str, Callable[[object], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "string": lambda v: isinstance(v, str),
    "number": _is_number,
    "integer": _is_integer,
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _json_type_name(value: object) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


def _declared_types(schema: Mapping[str, Any]) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        return []
    return [declared] if isinstance(declared, str) else list(declared)


def check_supported(schema: object, where: str = "schema") -> None:
    """Raise :class:`ConfigurationError` if ``schema`` uses anything outside the subset."""
    if not isinstance(schema, Mapping):
        raise ConfigurationError(f"{where}: a schema must be a mapping")
    unknown = set(schema) - ENFORCED - ANNOTATIONS
    if unknown:
        raise ConfigurationError(
            f"{where}: unsupported keyword(s) {', '.join(sorted(unknown))} "
            f"(supported: {', '.join(sorted(ENFORCED))})"
        )
    for name in _declared_types(schema):
        if name not in _TYPE_CHECKS:
            raise ConfigurationError(f"{where}.type: unknown type {name!r}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ConfigurationError(f"{where}.required: must be a list of names")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ConfigurationError(f"{where}.properties: must be a mapping")
    for name, sub in properties.items():
        check_supported(sub, f"{where}.properties.{name}")


def validate(instance: object, schema: Mapping[str, Any], path: str = "payload") -> None:
    """Check ``instance`` against ``schema``; raise ``SCHEMA_VIOLATION`` naming the field."""
    types = _declared_types(schema)
    if types and not any(_TYPE_CHECKS[name](instance) for name in types):
        raise PoisonError(
            "SCHEMA_VIOLATION",
            f"{path}: expected {' or '.join(types)}, got {_json_type_name(instance)}",
        )
    if not isinstance(instance, dict):
        return
    for name in schema.get("required", []):
        if name not in instance:
            raise PoisonError("SCHEMA_VIOLATION", f"{path}.{name}: required field is missing")
    for name, sub in schema.get("properties", {}).items():
        if name in instance:
            validate(instance[name], sub, f"{path}.{name}")
