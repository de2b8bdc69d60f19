"""The changes to a dead letter (see :mod:`shared.ops.dlq`): replay, park and discard of
one dead letter, each audited in ``dead_letter_actions`` (``ferry dlq``, the console)."""

from __future__ import annotations

import uuid
from typing import Any

from shared.adapters import dead_letters as store
from shared.adapters import parked_queue
from shared.adapters.postgres import connect
from shared.contracts.topology import DurableSpec, Topology
from shared.runtime.settings import CommonSettings


async def replay_dead_letter(
    settings: CommonSettings,
    topology: Topology,
    nc: Any,
    row: dict[str, Any],
    *,
    actor: str,
    reason: str,
    edit: store.Edit | None = None,
) -> store.Replayed:
    """Replay one dead letter as an operator (``ferry dlq replay``, the console), audited
    in ``dead_letter_actions``; :class:`store.NotReplayable` when it may not be. With
    ``edit``, with an edited payload (:mod:`shared.ops.dlq_edit`)."""
    durable = row["durable"]
    conn = await connect(settings.dsn(topology.context(topology.durable(durable).target).database))
    try:
        return await store.replay(
            conn,
            nc.jetstream(),
            durable=durable,
            message_id=row["message_id"],
            actor=actor,
            reason=reason,
            automatic=False,
            topology=topology,
            edit=edit,
        )
    finally:
        await conn.close()


async def set_dead_letter_status(
    settings: CommonSettings,
    topology: Topology,
    row: dict[str, Any],
    status: str,
    *,
    actor: str,
    reason: str,
) -> tuple[bool, str | None]:
    """Park or discard one dead letter (``ferry dlq park|discard``, the console), audited:
    (whether it changed, the ordering key released when a held head was discarded)."""
    spec = topology.durable(row["durable"])
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        return await change_status(
            conn, spec, row["durable"], row["message_id"], status, actor=actor, reason=reason
        )
    finally:
        await conn.close()


async def change_status(
    conn: Any,
    spec: DurableSpec,
    durable: str,
    message_id: uuid.UUID,
    status: str,
    *,
    actor: str,
    reason: str,
) -> tuple[bool, str | None]:
    """Park or discard one dead letter on ``conn`` (its database), audited; a discarded
    held head of an ``ordering: key`` durable releases its key: (changed, key released)."""
    done = await store.set_status(
        conn,
        durable=durable,
        message_id=message_id,
        status=status,  # type: ignore[arg-type]
        actor=actor,
        reason=reason,
    )
    released = None
    if done and status == "discarded" and spec.ordering == "key":
        # Its key's later events wait behind it no longer.
        released = await parked_queue.discard_held(
            conn, durable, message_id, actor=actor, reason=reason
        )
    return done, released
