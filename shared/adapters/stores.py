"""The PostgreSQL stores as objects implementing the ports of :mod:`shared.domain.ports`.

Thin on purpose: each method calls the module function of :mod:`.outbox` or :mod:`.inbox`
it names, unchanged, so the roles may keep calling the functions while the contract
suites (``tests/contracts/``) hold every implementation of a port (these, and the
in-memory ones of :mod:`.memory`) to the same promises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from shared.adapters import inbox, outbox, outbox_set_aside
from shared.adapters.postgres import Conn
from shared.domain.ports import (
    FailedAttempt,
    InboxDelivery,
    InboxStore,
    OutboxFailure,
    OutboxStore,
)


class PostgresOutboxStore(OutboxStore[Conn]):
    """:class:`~shared.domain.ports.OutboxStore` on the ``outbox_events`` table."""

    async def claim(self, conn: Conn, limit: int) -> outbox.Claim:
        return await outbox.claim(conn, limit)

    async def mark_published(self, conn: Conn, seqs: Sequence[int]) -> None:
        await outbox.mark_published(conn, list(seqs))

    async def mark_failed(
        self, conn: Conn, failures: Mapping[int, OutboxFailure], *, max_attempts: int
    ) -> dict[int, str]:
        rows = {seq: _failure(f) for seq, f in failures.items()}
        set_aside = await outbox.mark_failed(conn, rows, max_attempts=max_attempts)
        if set_aside:
            # The rows behind them leave the claim's walk in the same transaction.
            await outbox_set_aside.mark_waiting(conn)
        return set_aside

    async def backlog(self, conn: Conn) -> dict[str, Any]:
        return await outbox.backlog(conn)

    async def mark_waiting(self, conn: Conn) -> int:
        return await outbox_set_aside.mark_waiting(conn)


class PostgresInboxStore(InboxStore[Conn]):
    """:class:`~shared.domain.ports.InboxStore` on the ``inbox_messages`` table."""

    async def claim_batch(
        self,
        conn: Conn,
        *,
        durable: str,
        owner: str,
        lease_seconds: float,
        entries: Sequence[InboxDelivery],
    ) -> inbox.ClaimResult:
        return await inbox.claim_batch(
            conn,
            durable=durable,
            owner=owner,
            lease_seconds=lease_seconds,
            entries=entries,
        )

    async def mark_processed(self, conn: Conn, durable: str, outcomes: Mapping[UUID, int]) -> None:
        await inbox.mark_processed(conn, durable, dict(outcomes))

    async def mark_retrying(
        self, conn: Conn, durable: str, message_id: UUID, attempt: FailedAttempt
    ) -> None:
        await inbox.mark_retrying(conn, durable, message_id, attempt)

    async def backlog(self, conn: Conn, durable: str) -> dict[str, Any]:
        return await inbox.backlog(conn, durable)


def _failure(failure: OutboxFailure) -> outbox.Failure:
    if isinstance(failure, outbox.Failure):
        return failure
    return outbox.Failure(failure.error, failure.set_aside, failure.outage)
