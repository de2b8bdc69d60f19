"""The claim, and an optional effects ledger, in the handler's own database.

``handler_applied`` (:data:`CLAIMS_DDL`, the one table a team migrates)
    One row per (handler, message_id) whose effect committed. It is inserted in the
    same transaction as the effect, so "applied" and "effect exists" cannot disagree;
    a conflicting insert means the event was already processed (409). :func:`claim`
    does it inside a transaction the caller opened; :class:`~shared.sdk.handler.Handler`
    does it for its routes.
``handler_calls`` (:data:`LEDGER_DDL`, optional)
    The effects ledger: one row per call that the database decided, whatever its
    outcome, never deduplicated. An applying call's row (status 200) and a duplicate's
    (409) commit in the same transaction as the claim, so "answered 200" and "effect
    exists" cannot disagree; a call whose transaction rolls back is recorded right after
    the rollback with the status it answered. Only a call whose connection died before
    its commit leaves no row — and no effect. Ferry's tests and chaos suite count it to
    prove that no call applied an already-processed id twice.

Round trips: an applying call costs three (``BEGIN`` + claim, the route's statement,
ledger row + ``COMMIT``), the last two sent as one simple query each — or ONE when the
route gives its effect as a single statement (:func:`claim_apply_log`). The handler
service is the benchmark's bottleneck, and each round trip is a write and a wake-up on
both sides (measured: 30 % of the handler's CPU was socket writes at seven round trips).
Without the ledger the same statements run without its row.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from shared.adapters.postgres import SERVER_ERRORS, Conn, is_unique_violation, with_ctes

log = logging.getLogger("ferry.handlers")

#: Serialises concurrent ``CREATE TABLE IF NOT EXISTS`` of replicas starting together
#: (two such statements racing can fail on the catalog's unique index).
INSTALL_LOCK_KEY = 0x46455248  # "FERH"

#: What :func:`literal` accepts as text: handler names are context names (snake_case).
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")

#: The claim table: the one piece of schema the contract needs (migrate it with your own).
CLAIMS_DDL = """
CREATE TABLE IF NOT EXISTS handler_applied (
  message_id UUID NOT NULL,
  handler TEXT NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (handler, message_id)
)
"""

#: What ``ferry purge`` finds the claims past the context's ``claims_retention`` by: a
#: BRIN index (claims are inserted in time order; it costs the claim next to nothing).
CLAIMS_RETENTION_DDL = (
    "CREATE INDEX IF NOT EXISTS idx_handler_applied_at_brin ON handler_applied"
    " USING brin (applied_at)"
)

#: The optional effects ledger (Ferry's example handlers keep one).
LEDGER_DDL = (
    """
    CREATE TABLE IF NOT EXISTS handler_calls (
      id BIGSERIAL PRIMARY KEY,
      message_id UUID,
      handler TEXT NOT NULL,
      attempt INT,
      status INT,
      called_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX IF NOT EXISTS idx_handler_calls_message ON handler_calls (message_id)",
    "CREATE INDEX IF NOT EXISTS idx_handler_calls_at_brin ON handler_calls USING brin (called_at)",
)

#: Everything :func:`install` creates with the ledger.
BOOKKEEPING_DDL = (CLAIMS_DDL, CLAIMS_RETENTION_DDL, *LEDGER_DDL)


class NotInTransaction(RuntimeError):
    """:func:`claim` was called outside a transaction: the claim would commit alone."""


async def install(
    conn: Conn, ddl: Sequence[str], *, ledger: bool = True, purge_login: str | None = None
) -> None:
    """Create the claim table (and the ledger), then ``ddl`` (a service's own tables),
    idempotently; replicas starting together take turns. ``purge_login``: the login of
    the topology's retention role (``ferry_retention_<topology>``), which may then read
    and delete old claims (``claims_retention``); the service's login owns the tables, so
    only it can grant that."""
    bookkeeping = BOOKKEEPING_DDL if ledger else (CLAIMS_DDL, CLAIMS_RETENTION_DDL)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", INSTALL_LOCK_KEY)
        for statement in (*bookkeeping, *ddl):
            await conn.execute(statement)
        if purge_login is not None:
            await _grant_purge(conn, purge_login, ledger=ledger)


async def _grant_purge(conn: Conn, login: str, *, ledger: bool) -> None:
    """Grant the purge of old claims to ``login`` if it exists; a deployment without the
    retention role, or a login that does not own the tables (they were migrated by
    another), is told in the log and goes on: its claims are then purged by whoever
    grants it."""
    if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", login):
        log.warning("no login %s: old claims are not purged (ferry db-roles creates it)", login)
        return
    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the install whole
            await conn.execute(purge_grant(login, ledger=ledger))
    except SERVER_ERRORS as exc:
        log.warning(
            "cannot grant the purge of old claims to %s (%s): grant SELECT, DELETE on "
            "handler_applied%s to it as the tables' owner",
            login,
            exc,
            ", handler_calls" if ledger else "",
        )


def purge_grant(login: str, *, ledger: bool) -> str:
    """``GRANT SELECT, DELETE`` on the claim table (and the ledger) to ``login``."""
    if not IDENTIFIER.fullmatch(login):
        raise ValueError(f"retention login {login!r} must be a lower-case identifier")
    tables = "handler_applied, handler_calls" if ledger else "handler_applied"
    return f"GRANT SELECT, DELETE ON {tables} TO {login}"


async def claim(conn: Conn, *, handler: str, message_id: uuid.UUID | str) -> bool:
    """Claim ``message_id`` for ``handler`` in the transaction open on ``conn``.

    True: ours — do the effect on the same connection and commit; a failure that rolls the
    transaction back releases the claim with the effect. False: applied before — answer
    409 and change nothing. A concurrent claimer of the same id waits on the row until
    the first transaction ends, then sees its outcome.
    """
    if not conn.is_in_transaction():
        raise NotInTransaction("claim() must run inside the transaction of the effect")
    mid = message_id if isinstance(message_id, uuid.UUID) else uuid.UUID(message_id)
    taken = await conn.fetchval(
        "INSERT INTO handler_applied (message_id, handler, applied_at)"
        " VALUES ($1, $2, clock_timestamp())"
        " ON CONFLICT (handler, message_id) DO NOTHING RETURNING true",
        mid,
        handler,
    )
    return bool(taken)


def literal(value: uuid.UUID | int | str | None) -> str:
    """``value`` as an SQL literal, for the few statements sent as one simple query.

    Only UUIDs, integers and plain identifiers (handler names) are accepted — values whose
    text cannot contain a quote — so nothing here can inject SQL.
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        raise TypeError("no booleans here")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, uuid.UUID):
        return f"'{value}'::uuid"
    if not IDENTIFIER.fullmatch(value):
        raise ValueError(f"{value!r} is not a plain identifier")
    return f"'{value}'"


async def begin_and_claim(conn: Conn, *, handler: str, message_id: uuid.UUID) -> bool:
    """Open a transaction and claim ``message_id`` in it (one round trip); False if taken.

    A concurrent claimer of the same id blocks on the row until this transaction ends,
    then sees the conflict (commit) or claims it itself (rollback). The caller must end
    the transaction: :func:`end_call`.
    """
    result: str = await conn.execute(
        "BEGIN; INSERT INTO handler_applied (message_id, handler, applied_at)"
        f" VALUES ({literal(message_id)}, {literal(handler)}, clock_timestamp())"
        " ON CONFLICT (handler, message_id) DO NOTHING"
    )
    return result == "INSERT 0 1"


#: The claim's primary key: a unique violation on it means the id was applied before.
CLAIM_CONSTRAINT = "handler_applied_pkey"


@functools.lru_cache(maxsize=256)
def one_statement_sql(sql: str, arg_count: int, ledger: bool = True) -> str:
    """``sql`` (placeholders ``$1``…``$arg_count``) preceded by the claim and, with the
    ledger, the 200 ledger row as data-modifying CTEs, whose own arguments follow:
    message id, handler (and attempt, with the ledger).

    The claim has no ``ON CONFLICT``: an id applied before fails the whole statement
    with a unique violation on :data:`CLAIM_CONSTRAINT`, so the effect and the ledger row
    roll back with it. A concurrent claimer of the same id waits for the first one's
    outcome, as in the transaction of :func:`begin_and_claim`.
    """
    mid, handler, attempt = arg_count + 1, arg_count + 2, arg_count + 3
    head = (
        "ferry_claim AS (INSERT INTO handler_applied (message_id, handler, applied_at)"
        f" VALUES (${mid}, ${handler}, clock_timestamp()))"
    )
    if ledger:
        head += (
            ", ferry_call AS (INSERT INTO handler_calls (message_id, handler, attempt, status)"
            f" VALUES (${mid}, ${handler}, ${attempt}, 200))"
        )
    return with_ctes(sql, head)


async def claim_apply_log(
    conn: Conn,
    sql: str,
    args: Sequence[Any],
    *,
    handler: str,
    message_id: uuid.UUID,
    attempt: int | None,
    ledger: bool = True,
) -> bool:
    """Claim ``message_id``, run the route's statement (and record the 200), as one
    statement in its own transaction (one round trip; ``conn`` autocommits).

    False: the id was applied before and nothing changed (the caller records the 409).
    Any other failure raises, with nothing committed.
    """
    extra: tuple[Any, ...] = (message_id, handler, attempt) if ledger else (message_id, handler)
    try:
        await conn.execute(one_statement_sql(sql, len(args), ledger), *args, *extra)
    except SERVER_ERRORS as exc:
        if is_unique_violation(exc, CLAIM_CONSTRAINT):
            return False
        # PostgreSQL completes the claim after the effect, so a duplicate's effect can
        # fail first — on a unique index of its own, say. An id applied before is a
        # duplicate whatever failed, as it is when the claim goes first.
        if await applied_at(conn, handler=handler, message_id=message_id) is not None:
            return False
        raise
    return True


def _call_row(handler: str, message_id: uuid.UUID | None, attempt: int | None, status: int) -> str:
    return _call_rows(handler, [(message_id, attempt, status)])


def _call_rows(handler: str, calls: Sequence[tuple[uuid.UUID | None, int | None, int]]) -> str:
    """One INSERT of every call (PostgreSQL parses and plans it once, not once a row)."""
    values = ", ".join(
        f"({literal(mid)}, {literal(handler)}, {literal(attempt)}, {literal(status)})"
        for mid, attempt, status in calls
    )
    return f"INSERT INTO handler_calls (message_id, handler, attempt, status) VALUES {values}"


async def end_call(
    conn: Conn,
    *,
    commit: bool,
    handler: str,
    message_id: uuid.UUID,
    attempt: int | None,
    status: int,
    ledger: bool = True,
) -> None:
    """End the call's transaction and record the call (with the ledger), one round trip.

    ``commit``: record the call with its answer and commit it with the effect; else undo
    the claim and whatever the route did, then record the call."""
    row = _call_row(handler, message_id, attempt, status) if ledger else None
    if commit:
        sql = "COMMIT" if row is None else row + "; COMMIT"
    else:
        sql = "ROLLBACK" if row is None else "ROLLBACK; " + row
    await conn.execute(sql)


async def log_call(
    conn: Conn, *, handler: str, message_id: uuid.UUID | None, attempt: int | None, status: int
) -> None:
    """Record a call that changed nothing (poison, injected answers); ``conn`` autocommits."""
    await conn.execute(
        "INSERT INTO handler_calls (message_id, handler, attempt, status) VALUES ($1, $2, $3, $4)",
        message_id,
        handler,
        attempt,
        status,
    )


async def applied_at(conn: Conn, *, handler: str, message_id: uuid.UUID) -> datetime | None:
    """When ``message_id`` was applied by ``handler``, if it was."""
    moment: datetime | None = await conn.fetchval(
        "SELECT applied_at FROM handler_applied WHERE handler = $1 AND message_id = $2",
        handler,
        message_id,
    )
    return moment


#: The savepoint each event of a batch transaction runs under.
SAVEPOINT = "ferry_event"


class BatchTransaction:
    """One transaction for the events of a batch call, a savepoint per event.

    :meth:`claim_all` opens it and claims every id at once (the common case: no duplicate,
    no failure, no savepoint). Otherwise :meth:`claim` opens the transaction (first event)
    or releases the previous event's savepoint, sets the event's own and claims its id —
    one round trip; :meth:`undo` rolls back to it (the event's claim and effect only).
    :meth:`commit` records the calls (with the ledger) and commits everything at once. Any
    other end: :meth:`abort`.
    """

    def __init__(self, conn: Conn, *, handler: str) -> None:
        self.conn, self.handler = conn, handler
        self._begun = self._savepoint = False

    async def claim(self, message_id: uuid.UUID) -> bool:
        """Claim ``message_id`` under a fresh savepoint; False when it was applied before."""
        head = "BEGIN; " if not self._begun else ""
        if self._savepoint:
            head += f"RELEASE SAVEPOINT {SAVEPOINT}; "
        result: str = await self.conn.execute(
            f"{head}SAVEPOINT {SAVEPOINT}; INSERT INTO handler_applied"
            " (message_id, handler, applied_at)"
            f" VALUES ({literal(message_id)}, {literal(self.handler)}, clock_timestamp())"
            " ON CONFLICT (handler, message_id) DO NOTHING"
        )
        self._begun = self._savepoint = True
        return result == "INSERT 0 1"

    async def claim_all(self, message_ids: Sequence[uuid.UUID]) -> bool:
        """Open the transaction and claim every id in one statement, no savepoint; False
        when one was applied before (or listed twice): the caller aborts."""
        values = ", ".join(
            f"({literal(mid)}, {literal(self.handler)}, clock_timestamp())" for mid in message_ids
        )
        result: str = await self.conn.execute(
            "BEGIN; INSERT INTO handler_applied (message_id, handler, applied_at)"
            f" VALUES {values} ON CONFLICT (handler, message_id) DO NOTHING"
        )
        self._begun = True
        return result == f"INSERT 0 {len(message_ids)}"

    async def undo(self) -> None:
        """Roll back the current event (its claim and whatever its route did)."""
        await self.conn.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")

    async def commit(self, calls: Sequence[tuple[uuid.UUID | None, int | None, int]]) -> None:
        """Record ``calls`` (message id, attempt, status) and commit (one round trip)."""
        rows = [_call_rows(self.handler, calls)] if calls else []
        if not self._begun:
            if rows:
                await self.conn.execute("; ".join(rows))
            return
        head = [f"RELEASE SAVEPOINT {SAVEPOINT}"] if self._savepoint else []
        await self.conn.execute("; ".join([*head, *rows, "COMMIT"]))
        self._begun = self._savepoint = False

    async def abort(self) -> None:
        """Roll back whatever is open (best effort: the connection may be gone)."""
        if self._begun and not self.conn.is_closed():
            self._begun = self._savepoint = False
            try:
                await self.conn.execute("ROLLBACK")
            except Exception as exc:  # the pool discards a broken connection anyway
                log.debug("rollback of a batch failed: %s", exc)
