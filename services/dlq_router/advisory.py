"""JetStream's MAX_DELIVERIES and MSG_TERMINATED advisories, as the dlq-router reads them.

:meth:`Advisory.parse` returns an :class:`Advisory` or raises :class:`InvalidAdvisory`
naming what is wrong — for any bytes at all (not JSON, not UTF-8, nested past the
parser's recursion limit, numbers too large to convert, a sequence that is not positive).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.domain.errors import FerryError

MAX_DELIVER_TYPE = "io.nats.jetstream.advisory.v1.max_deliver"
TERMINATED_TYPE = "io.nats.jetstream.advisory.v1.terminated"
KINDS = {MAX_DELIVER_TYPE: "max_deliveries", TERMINATED_TYPE: "terminated"}
#: Longest name (stream, consumer) an advisory can carry: JetStream caps names far lower.
MAX_NAME = 255


class InvalidAdvisory(FerryError, ValueError):
    """An advisory the router cannot use; the message says which field and why."""


@dataclass(frozen=True)
class Advisory:
    """What a MAX_DELIVERIES or MSG_TERMINATED advisory says."""

    kind: str  # "max_deliveries" | "terminated"
    stream: str
    #: The JetStream consumer the advisory names (the router maps a partition's consumer,
    #: ``{durable}_p{k}``, to its durable).
    durable: str
    stream_seq: int
    deliveries: int
    reason: str

    @classmethod
    def parse(cls, data: bytes) -> Advisory:
        """Parse an advisory body; :class:`InvalidAdvisory` names what is wrong."""
        doc = _document(data)
        declared = doc.get("type")
        kind = KINDS.get(declared) if isinstance(declared, str) else None
        if kind is None:
            raise InvalidAdvisory(f"unexpected advisory type {_shown(doc.get('type'))}")
        return cls(
            kind=kind,
            stream=_name(doc, "stream"),
            durable=_name(doc, "consumer"),
            stream_seq=_count(doc, "stream_seq", required=True, minimum=1),
            deliveries=_count(doc, "deliveries", required=False, minimum=0),
            reason=doc["reason"][:1000] if isinstance(doc.get("reason"), str) else "",
        )


def _document(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidAdvisory(f"advisory is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidAdvisory("advisory is nested too deeply to parse") from exc
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise InvalidAdvisory(f"advisory is not usable JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidAdvisory(f"advisory is a JSON {type(doc).__name__}, not an object")
    return doc


def _name(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise InvalidAdvisory(f"advisory field {key!r} must be a name, got {_shown(value)}")
    return value


def _count(doc: dict[str, Any], key: str, *, required: bool, minimum: int) -> int:
    value = doc.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidAdvisory(
            f"advisory field {key!r} must be an integer >= {minimum}, got {_shown(value)}"
        )
    if value >= 2**63:
        raise InvalidAdvisory(f"advisory field {key!r} is out of range")
    return value


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float)


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "a huge integer"
    text = repr(value) if _plain(value) or value is None else f"a {type(value).__name__}"
    return text[:80]
