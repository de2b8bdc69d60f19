"""Parked keys: the keys an ``ordering: key`` durable holds back, and their heads (what
``ferry parked`` — shared/cli/parked.py — and the console show and discard).

A key is parked when one of its events failed: that event (the head) and every later event
of the key wait in ``parked_messages`` (migration 0009) while the rest of the durable flows.
A ``retrying`` head is tried again by the consumer when its back-off ends; a ``held`` head
was dead-lettered under ``on_dead_letter: hold`` and waits for an operator: replay its dead
letter (``ferry dlq replay``: the replayed copy takes the head's place) or discard it
(its later events then go on; its dead letter stays, for the audit). Every discard is
recorded in ``parked_actions`` with who, when and why.
"""

from __future__ import annotations

import uuid
from typing import Any

from shared.adapters import parked_queue
from shared.adapters.postgres import connect
from shared.runtime.settings import CommonSettings


async def _connect(settings: CommonSettings, durable: str) -> Any:
    topology = settings.load_topology()
    spec = topology.durable(durable)
    return await connect(settings.dsn(topology.context(spec.target).database))


async def parked_keys(
    settings: CommonSettings, durable: str, key: str | None = None, limit: int = 100
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A durable's parked keys, oldest first, with their heads, and its summary (keys,
    events, held heads): ``ferry parked list``, the console."""
    conn = await _connect(settings, durable)
    try:
        rows = await parked_queue.keys(conn, durable, key, limit)
        summary = await parked_queue.summary(conn, durable)
    finally:
        await conn.close()
    return rows, summary


async def discard_parked_head(
    settings: CommonSettings, durable: str, key: str, *, actor: str, reason: str
) -> uuid.UUID | None:
    """Discard ``key``'s held head (audited in ``parked_actions``): ``ferry parked
    discard``, the console; None when the key holds no held head."""
    conn = await _connect(settings, durable)
    try:
        return await parked_queue.discard_head(conn, durable, key, actor=actor, reason=reason)
    finally:
        await conn.close()
