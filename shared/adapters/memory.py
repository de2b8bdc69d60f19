"""In-memory adapters of the ports of :mod:`shared.domain.ports`, for tests and local runs.

* :class:`MemoryOutboxStore` — :class:`~shared.domain.ports.OutboxStore` (here, with the
  connections and transactions both stores share);
* :class:`~shared.adapters.memory_inbox.MemoryInboxStore` —
  :class:`~shared.domain.ports.InboxStore`;
* :class:`~shared.adapters.memory_handler.ScriptedHandler` —
  :class:`~shared.domain.ports.HandlerPort`: answers from a script per message id (or a
  default), records every call.

The stores keep the same contract suites (``tests/contracts/``) as the PostgreSQL ones.
They take a :class:`MemoryConn` as the caller's connection: its :meth:`~MemoryConn.
transaction` (``async with``, or ``start`` / ``commit`` / ``rollback``) scopes what
PostgreSQL's transaction would — an outbox claim's locks last until it ends, a row
written inside it is seen by other connections only once it commits, and a rollback
undoes the store changes made inside it. Any other object is taken as a connection in
autocommit (every call is its own transaction), so a fake pool may hand out ``object()``.
The stores are one process's state: no durability, no other process sees them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from uuid import UUID

from shared.adapters.outbox import Claim, OutboxRow
from shared.domain.ports import (
    OutboxFailure,
    OutboxStore,
)

# --- connections and transactions -----------------------------------------------------


class MemoryTransaction:
    """One transaction of a :class:`MemoryConn`: what ends with it, what its rollback undoes."""

    def __init__(self, conn: MemoryConn) -> None:
        self.conn = conn
        self._undo: list[Callable[[], object]] = []
        self._on_commit: list[Callable[[], object]] = []
        self._on_end: list[Callable[[], object]] = []

    def on_commit(self, action: Callable[[], object]) -> None:
        """Run ``action`` when the transaction commits."""
        self._on_commit.append(action)

    def on_rollback(self, action: Callable[[], object]) -> None:
        """Run ``action`` if the transaction rolls back (the last registered first)."""
        self._undo.append(action)

    def on_end(self, action: Callable[[], object]) -> None:
        """Run ``action`` when the transaction ends, either way (its locks are released)."""
        self._on_end.append(action)

    async def start(self) -> None:
        if self.conn.current is not None:
            raise RuntimeError("a transaction is already open on this connection")
        self.conn.current = self

    async def commit(self) -> None:
        for action in self._on_commit:
            action()
        self._end()

    async def rollback(self) -> None:
        for action in reversed(self._undo):
            action()
        self._end()

    def _end(self) -> None:
        for action in self._on_end:
            action()
        self._undo.clear()
        self._on_commit.clear()
        self._on_end.clear()
        self.conn.current = None

    async def __aenter__(self) -> MemoryTransaction:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            await self.commit()
        else:
            await self.rollback()


class MemoryConn:
    """A connection to the in-memory stores (the handle their calls take)."""

    def __init__(self) -> None:
        self.current: MemoryTransaction | None = None

    def transaction(self) -> MemoryTransaction:
        """A new transaction on this connection (``async with`` it, or ``start`` it)."""
        return MemoryTransaction(self)


def _transaction(conn: object) -> MemoryTransaction | None:
    return conn.current if isinstance(conn, MemoryConn) else None


def _undo(conn: object, action: Callable[[], object]) -> None:
    """Run ``action`` if the caller's transaction rolls back (nothing in autocommit)."""
    tx = _transaction(conn)
    if tx is not None:
        tx.on_rollback(action)


# --- outbox ---------------------------------------------------------------------------

#: The back-off of a failing row, as the PostgreSQL outbox's (``shared.adapters.outbox``).
_BACKOFF_BASE, _BACKOFF_EXPONENT_CAP, _BACKOFF_CAP = 0.1, 10, 60.0
PUBLISH_REFUSED = "PUBLISH_REFUSED"


@dataclass(frozen=True, slots=True)
class _OutboxState:
    """A row's publishing state (replaced whole, so a rollback restores the old one)."""

    published: bool = False
    attempts: int = 0
    error: str | None = None
    last_attempt: float | None = None
    set_aside: str | None = None


class MemoryOutboxStore(OutboxStore[object]):
    """:class:`~shared.domain.ports.OutboxStore` in dicts; :meth:`append` writes a row.

    Claim locks belong to the caller's :class:`MemoryTransaction` (a claim outside one
    locks nothing, as an autocommit ``SELECT … FOR UPDATE`` would); a row appended inside
    a transaction takes its ``seq`` at once but is seen by others only after the commit.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._rows: dict[int, OutboxRow] = {}
        self._state: dict[int, _OutboxState] = {}
        #: seq -> the transaction that wrote it, until that commits.
        self._uncommitted: dict[int, MemoryTransaction] = {}
        #: seq -> the transaction whose claim locks it.
        self._locks: dict[int, MemoryTransaction] = {}
        self._next_seq = 1

    async def append(
        self,
        conn: object,
        *,
        aggregate_type: str,
        aggregate_id: str,
        event_type: str,
        payload: str,
        event_version: int = 1,
        event_id: UUID | None = None,
        occurred_at: datetime | None = None,
    ) -> UUID:
        """Write one outbox row (the producer's insert, without its validation)."""
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        row_id = event_id or uuid.uuid4()
        self._rows[seq] = OutboxRow(
            id=row_id,
            seq=seq,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            event_type=event_type,
            event_version=event_version,
            payload=payload,
            occurred_at=occurred_at or datetime.now(UTC),
        )
        self._state[seq] = _OutboxState()
        tx = _transaction(conn)
        if tx is not None:
            self._uncommitted[seq] = tx
            tx.on_commit(lambda: self._committed(seq))
            tx.on_rollback(lambda: self._forget(seq))
        return row_id

    def _committed(self, seq: int) -> None:
        self._uncommitted.pop(seq, None)

    def _unlock(self, seq: int) -> Callable[[], object]:
        return lambda: self._locks.pop(seq, None)

    def _forget(self, seq: int) -> None:
        self._rows.pop(seq, None)
        self._state.pop(seq, None)
        self._uncommitted.pop(seq, None)

    def _visible(self, conn: object) -> list[int]:
        """The seqs the caller sees, in order: committed rows and its own."""
        tx = _transaction(conn)
        return sorted(s for s in self._rows if self._uncommitted.get(s, tx) is tx)

    def _backing_off(self, state: _OutboxState, now: float) -> bool:
        if state.attempts == 0 or state.last_attempt is None:
            return False
        exponent = min(max(state.attempts, 0), _BACKOFF_EXPONENT_CAP)
        return state.last_attempt >= now - min(_BACKOFF_BASE * 2.0**exponent, _BACKOFF_CAP)

    async def claim(self, conn: object, limit: int) -> Claim:
        tx, now = _transaction(conn), self.clock()
        pending = [s for s in self._visible(conn) if not self._state[s].published]
        blocked: set[tuple[str, str]] = set()  # aggregates behind a failing row
        candidates: list[int] = []
        for seq in pending:
            state, key = self._state[seq], self._rows[seq].aggregate
            failing = state.set_aside is not None or self._backing_off(state, now)
            if key in blocked:
                continue
            if failing:
                blocked.add(key)
                continue
            if self._locks.get(seq, tx) is not tx:
                continue  # SKIP LOCKED
            candidates.append(seq)
            if len(candidates) == limit:
                break
        chosen = set(candidates)
        rows, held_back = [], 0
        for seq in candidates:
            key = self._rows[seq].aggregate
            if any(p < seq and p not in chosen and self._rows[p].aggregate == key for p in pending):
                held_back += 1
            else:
                rows.append(self._rows[seq])
            if tx is not None and seq not in self._locks:
                self._locks[seq] = tx
                tx.on_end(self._unlock(seq))
        return Claim(rows, held_back)

    def _update(self, conn: object, seq: int, state: _OutboxState) -> None:
        old = self._state[seq]
        self._state[seq] = state
        _undo(conn, lambda: self._state.__setitem__(seq, old))

    async def mark_published(self, conn: object, seqs: Sequence[int]) -> None:
        for seq in seqs:
            if (state := self._state.get(seq)) is not None:
                done = replace(
                    state,
                    published=True,
                    attempts=state.attempts + 1,
                    error=None,
                    last_attempt=self.clock(),
                )
                self._update(conn, seq, done)

    async def mark_failed(
        self, conn: object, failures: Mapping[int, OutboxFailure], *, max_attempts: int
    ) -> dict[int, str]:
        set_aside: dict[int, str] = {}
        for seq, failure in failures.items():
            if (state := self._state.get(seq)) is None:
                continue
            reason = failure.set_aside
            if reason is None and not failure.outage and state.attempts >= max_attempts - 1:
                reason = PUBLISH_REFUSED
            failed = replace(
                state,
                attempts=state.attempts + 1,
                error=failure.error,
                last_attempt=self.clock(),
                set_aside=reason,
            )
            self._update(conn, seq, failed)
            if reason is not None:
                set_aside[seq] = reason
        return set_aside

    async def backlog(self, conn: object) -> dict[str, Any]:
        pending = [s for s in self._visible(conn) if not self._state[s].published]
        states = [self._state[s] for s in pending]
        oldest = min((self._rows[s].occurred_at for s in pending), default=None)
        return {
            "count": len(pending),
            "oldest_at": oldest.isoformat() if oldest else None,
            "failing": sum(1 for s in states if s.error is not None),
            "set_aside": sum(1 for s in states if s.set_aside is not None),
            "max_attempts": max((s.attempts for s in states), default=0),
        }

    async def mark_waiting(self, conn: object) -> int:
        """Nothing to do: the claim here reads every row anyway."""
        return 0
