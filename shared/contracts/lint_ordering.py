"""The lint's ordering rules (``ordering-*``), and the check of an event's ordering key field."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shared.contracts.lint_findings import Problem
from shared.contracts.topology import Topology


def ordering(topology: Topology, source: str) -> Iterator[Problem]:
    for name, durable in sorted(topology.durables.items()):
        prefix = f"durables.{name}"
        if durable.ordering == "none":
            if "on_dead_letter" in durable.model_fields_set:
                yield Problem(
                    source,
                    f"{prefix}.on_dead_letter",
                    "ordering-unused",
                    f"{durable.on_dead_letter} has no effect with ordering: none: nothing "
                    "waits behind a dead letter of an unordered durable; declare ordering: "
                    "key or drop on_dead_letter",
                )
            continue
        if durable.on_dead_letter == "skip" and durable.replay == "automatic":
            yield Problem(
                source,
                f"{prefix}.on_dead_letter",
                "ordering-replay",
                "skip with replay: automatic cannot keep the key's order: its later events "
                "go on past the dead letter, and the automatic replay of it then arrives "
                "after them (order broken twice); use on_dead_letter: hold, whose key waits "
                "for the replay, or replay: operator",
            )
    for event in topology.events:
        if event.ordering_key is None:
            continue
        reason = ordering_key_defect(event.payload_schema or {}, event.ordering_key)
        if reason:
            yield Problem(
                event.manifest or source,
                f"publishes.{event.name}.ordering_key",
                "ordering-key-field",
                f"{event.ordering_key!r} {reason}: a valid payload could lack its ordering "
                "key or carry one that is not a string or an integer",
            )


def ordering_key_defect(schema: Mapping[str, Any], path: str) -> str | None:
    """Why ``path`` is not a required string/integer property of ``schema`` (None: it is)."""
    node: Mapping[str, Any] = schema
    parts = path.split(".")
    for depth, part in enumerate(parts):
        properties = node.get("properties")
        required = node.get("required")
        where = ".".join(parts[:depth]) or "the payload"
        if not isinstance(properties, Mapping) or part not in properties:
            return f"is not a property of the schema (no {part!r} in {where})"
        if not isinstance(required, list) or part not in required:
            return f"is not required by the schema ({part!r} is optional in {where})"
        child = properties[part]
        if not isinstance(child, Mapping):
            return f"has no usable schema at {'.'.join(parts[: depth + 1])!r}"
        node = child
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if not isinstance(kinds, list) or not kinds or not set(kinds) <= {"string", "integer"}:
        return f"is typed {node.get('type')!r} in the schema, not string or integer"
    return None
