"""Typed reads of payload fields for routes, each a 422 when the field is unusable.

The topology's schema is checked before a route runs, but a topology may declare no
schema for an event, and a route must not turn a missing field into a 500 (retried
until the ladder runs out) when the payload can simply never be applied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.domain.errors import PoisonError


def text(payload: Mapping[str, Any], name: str) -> str:
    """``payload[name]`` as a non-empty string."""
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise PoisonError("INVALID_FIELD", f"payload.{name} must be a non-empty string")
    return value


def number(payload: Mapping[str, Any], name: str) -> float:
    """``payload[name]`` as a float (JSON number; booleans refused)."""
    value = payload.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PoisonError("INVALID_FIELD", f"payload.{name} must be a number")
    return float(value)


def integer(payload: Mapping[str, Any], name: str) -> int:
    """``payload[name]`` as an int (3.0 counts, as in JSON Schema; booleans refused)."""
    value = payload.get(name)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PoisonError("INVALID_FIELD", f"payload.{name} must be an integer")
    return value


def business_json(payload: Mapping[str, Any]) -> str:
    """``payload`` as JSON for a jsonb column."""
    return json.dumps(payload, ensure_ascii=False)
