"""The in-memory :class:`~shared.domain.ports.InboxStore` (see :mod:`shared.adapters.memory`
for the connections and transactions it shares with the outbox store)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from shared.adapters.memory import _undo
from shared.domain.ports import FailedAttempt, InboxDelivery, InboxStore

# --- inbox ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryInboxClaim:
    """Per message id: claimed, final or leased (:class:`~shared.domain.ports.InboxClaim`)."""

    claimed: dict[UUID, int]
    final: set[UUID]
    leased: dict[UUID, float]


@dataclass(frozen=True, slots=True)
class MemoryInboxRow:
    """One ``(durable, message_id)`` of the inbox (replaced whole on every change)."""

    subject: str
    status: str  # processing, retrying, processed (failed: dead-lettered elsewhere)
    attempts: int
    received_at: datetime
    lease_owner: str | None = None
    lease_until: float | None = None
    handler_status: int | None = None
    last_error: str | None = None
    reason_code: str | None = None
    retry_history: tuple[dict[str, Any], ...] = ()
    duplicates: int = 0


class MemoryInboxStore(InboxStore[object]):
    """:class:`~shared.domain.ports.InboxStore` in a dict keyed by ``(durable, message_id)``.

    A row is (re)claimed unless its outcome is final or any delivery holds a live lease
    on it, as the PostgreSQL inbox's ``ON CONFLICT … WHERE`` decides.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.rows: dict[tuple[str, UUID], MemoryInboxRow] = {}

    def _put(self, conn: object, key: tuple[str, UUID], row: MemoryInboxRow) -> None:
        old = self.rows.get(key)
        self.rows[key] = row
        if old is None:
            _undo(conn, lambda: self.rows.pop(key, None))
        else:
            _undo(conn, lambda: self.rows.__setitem__(key, old))

    async def claim_batch(
        self,
        conn: object,
        *,
        durable: str,
        owner: str,
        lease_seconds: float,
        entries: Sequence[InboxDelivery],
    ) -> MemoryInboxClaim:
        now = self.clock()
        claim = MemoryInboxClaim(claimed={}, final=set(), leased={})
        for entry in entries:
            key = (durable, entry.message_id)
            row = self.rows.get(key)
            if row is None:
                row = MemoryInboxRow(
                    entry.subject, "processing", 1, datetime.now(UTC), owner, now + lease_seconds
                )
            elif row.status in ("processed", "failed"):
                claim.final.add(entry.message_id)
                self._put(conn, key, replace(row, duplicates=row.duplicates + 1))
                continue
            elif row.status == "processing" and (row.lease_until or 0.0) >= now:
                claim.leased[entry.message_id] = max((row.lease_until or now) - now, 0.0)
                continue
            else:
                row = replace(
                    row,
                    status="processing",
                    attempts=row.attempts + 1,
                    lease_owner=owner,
                    lease_until=now + lease_seconds,
                )
            self._put(conn, key, row)
            claim.claimed[entry.message_id] = row.attempts
        return claim

    async def mark_processed(
        self, conn: object, durable: str, outcomes: Mapping[UUID, int]
    ) -> None:
        for message_id, status in outcomes.items():
            self._settle(
                conn,
                (durable, message_id),
                status="processed",
                handler_status=status,
                last_error=None,
            )

    async def mark_retrying(
        self, conn: object, durable: str, message_id: UUID, attempt: FailedAttempt
    ) -> None:
        self._settle(
            conn,
            (durable, message_id),
            history=attempt.history_entry,
            status="retrying",
            last_error=attempt.error,
            handler_status=attempt.status,
            reason_code=attempt.reason_code,
        )

    def _settle(
        self,
        conn: object,
        key: tuple[str, UUID],
        *,
        history: dict[str, Any] | None = None,
        **changes: Any,
    ) -> None:
        """The row of ``key`` (if any) with ``changes``, its lease released, and ``history``
        (if given) added to its retry history."""
        if (row := self.rows.get(key)) is None:
            return
        if history is not None:
            changes["retry_history"] = (*row.retry_history, dict(history))
        self._put(conn, key, replace(row, lease_owner=None, lease_until=None, **changes))

    async def backlog(self, conn: object, durable: str) -> dict[str, Any]:
        open_rows = [r for (d, _), r in self.rows.items() if d == durable]
        open_rows = [r for r in open_rows if r.status != "processed"]
        # The oldest row in play, as PostgreSQL's: a dead letter waits for an operator.
        oldest = min((r.received_at for r in open_rows if r.status != "failed"), default=None)
        return {
            "count": len(open_rows),
            "oldest_at": oldest.isoformat() if oldest else None,
            "retrying": sum(1 for r in open_rows if r.status == "retrying"),
            "failed": sum(1 for r in open_rows if r.status == "failed"),
        }
