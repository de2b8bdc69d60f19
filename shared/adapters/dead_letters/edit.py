"""Edit-and-retry: a dead letter replayed with a payload an operator edited.

:func:`~shared.adapters.dead_letters.replay.replay` takes an :class:`Edit` and, in the
transaction that marks the replay, calls :func:`apply_edit`: the envelope stored in the
row gets the new payload (and its digest) — the replay, and any republish of it, then
publishes the edited envelope under the same message id — and the edit is audited in
``dead_letter_edits`` with both versions (migrations/0017). The checks (schema, ordering
key) are the caller's, given as :attr:`Edit.check`; a refusal rolls everything back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from shared.adapters.dead_letters import records
from shared.adapters.postgres import Conn
from shared.domain.dead_letter_edit import changed_paths, edited_envelope

#: Checks an edit: (the envelope now, the edited one); raises :class:`EditRefused`.
EditCheck = Callable[[dict[str, Any], dict[str, Any]], None]


class EditRefused(Exception):
    """The edited payload may not be replayed (its schema refuses it, it changes nothing,
    it moves the event to another ordering key); the message names why."""


@dataclass(frozen=True)
class Edit:
    """A new payload for a dead letter, and the checks it must pass."""

    payload: dict[str, Any]
    check: EditCheck


def current_envelope(record: dict[str, Any]) -> dict[str, Any] | None:
    """The envelope a replay of ``record`` would publish, decoded; None without one."""
    body = records.replay_body(record)
    if body is None:
        return None
    doc = json.loads(body.decode("utf-8", "surrogatepass"))
    return doc if isinstance(doc, dict) else None


def edit_plan(
    record: dict[str, Any], edit: Edit
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(the envelope now, the edited envelope, the changed paths) of ``edit`` on
    ``record``, checked; :class:`EditRefused` when it may not be replayed."""
    before = current_envelope(record)
    if before is None:
        raise EditRefused("it keeps no parseable envelope to edit")
    after = edited_envelope(before, edit.payload)
    changed = changed_paths(before.get("payload"), edit.payload)
    if not changed:
        raise EditRefused("the edited payload is the same as the current one: replay it instead")
    edit.check(before, after)
    return before, after, changed


_STORE_EDITED = """
UPDATE dead_letters SET record = $3::jsonb, updated_at = clock_timestamp()
WHERE durable = $1 AND message_id = $2
"""

_AUDIT = """
INSERT INTO dead_letter_edits (durable, message_id, event_type, event_version, replay_attempt,
                               original_payload, edited_payload, changed, actor, reason)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8::text[], $9, $10)
RETURNING id
"""


async def apply_edit(
    conn: Conn,
    durable: str,
    message_id: UUID,
    record: dict[str, Any],
    edit: Edit,
    *,
    attempt: int,
    actor: str,
    reason: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Store the edited envelope in the (locked) row and audit the edit, in the caller's
    transaction: (the record to replay, the action's details)."""
    before, after, changed = edit_plan(record, edit)
    edited = {**record, "payload": after}
    await conn.execute(_STORE_EDITED, durable, message_id, records.stored_record(edited))
    edit_id = await conn.fetchval(
        _AUDIT,
        durable,
        message_id,
        after.get("event_type"),
        after.get("event_version"),
        attempt,
        json.dumps(records.storable(before.get("payload")), ensure_ascii=False),
        json.dumps(records.storable(edit.payload), ensure_ascii=False),
        changed,
        actor,
        reason,
    )
    return edited, {"edit_id": edit_id, "changed": changed}


async def edits(conn: Conn, durable: str, message_id: UUID) -> list[dict[str, Any]]:
    """The edits of one dead letter, oldest first, both payloads decoded."""
    rows = await conn.fetch(
        "SELECT id, at, actor, reason, replay_attempt, changed, original_payload, "
        "edited_payload FROM dead_letter_edits WHERE durable = $1 AND message_id = $2 "
        "ORDER BY at, id",
        durable,
        message_id,
    )
    return [
        {
            **dict(r),
            "changed": list(r["changed"]),
            "original_payload": json.loads(r["original_payload"]),
            "edited_payload": json.loads(r["edited_payload"]),
        }
        for r in rows
    ]
