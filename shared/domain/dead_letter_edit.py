"""Editing a dead letter's payload before it is replayed (``ferry dlq edit``, the console).

Only the payload changes: the edited envelope keeps every other field — the
``message_id`` (the inbox key) first — and carries the digest of its new payload, so the
consumer's digest check passes. What changed is named by path (``payload.title``), and an
operator reads the change as a before/after diff. Pure: the schema check and the audit
are the callers'.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any

from shared.domain.errors import MalformedInput
from shared.domain.json_text import json_defect, payload_digest

#: Most characters of edited payload text read (a payload is at most a message's size).
MAX_EDIT_CHARS = 8 * 1024 * 1024


def parse_edited_payload(text: str) -> dict[str, Any]:
    """The JSON object an operator gave as the new payload; :class:`MalformedInput`
    naming what is wrong (not JSON, not an object, too deep, a lone surrogate)."""
    if len(text) > MAX_EDIT_CHARS:
        raise MalformedInput(f"the payload is over {MAX_EDIT_CHARS:,} characters")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise MalformedInput("the payload is nested too deeply") from None
    except ValueError as exc:
        raise MalformedInput(f"the payload is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedInput(f"the payload must be a JSON object, not {type(value).__name__}")
    defect = json_defect(value, where="payload")
    if defect is not None:
        raise MalformedInput(defect)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def edited_envelope(envelope: Mapping[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """``envelope`` with ``payload`` in place of its own and that payload's digest; every
    other field (``message_id``, subject, type, version, aggregate, times) unchanged."""
    doc = dict(envelope)
    doc["payload"] = payload
    doc["payload_digest"] = payload_digest(payload)
    return doc


def _same(before: Any, after: Any) -> bool:
    # JSON equality: 1 and 1.0 are one number, but true is not 1.
    return (type(before) is type(after) and before == after) or (
        isinstance(before, int | float)
        and isinstance(after, int | float)
        and not isinstance(before, bool)
        and not isinstance(after, bool)
        and before == after
    )


def changed_paths(before: Any, after: Any, path: str = "payload") -> list[str]:
    """The paths where ``after`` differs from ``before``: a field added, removed or
    changed (objects are compared field by field, anything else as a whole)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for name in sorted(set(before) | set(after)):
            where = f"{path}.{name}"
            if name not in before or name not in after:
                out.append(where)
            else:
                out += changed_paths(before[name], after[name], where)
        return out
    return [] if _same(before, after) else [path]


def payload_diff(before: Any, after: Any) -> list[str]:
    """A unified diff of the two payloads as indented JSON with sorted keys."""

    def lines(value: Any) -> list[str]:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    return list(
        difflib.unified_diff(
            lines(before), lines(after), fromfile="before", tofile="after", lineterm=""
        )
    )
