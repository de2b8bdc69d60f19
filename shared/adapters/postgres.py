"""PostgreSQL plumbing shared by every role: pools, database creation, migrations."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from asyncpg.exceptions._base import DataError as ArgumentDataError
from asyncpg.pool import PoolConnectionProxy

from shared.domain.errors import ConfigurationError, TransientError
from shared.telemetry import hops

log = logging.getLogger("ferry.postgres")

#: Migrations live at the repository root, beside this package.
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
#: Advisory-lock key that serialises concurrent migrators on one database.
MIGRATION_LOCK_KEY = 0x46455252  # "FERR"
#: Errors that mean "the server is (temporarily) not there", not "your SQL is wrong".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    TimeoutError,
)
#: The server refused or failed a statement (any SQLSTATE; not a lost connection).
SERVER_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError,)
#: Connection errors plus server-side errors: what a retry loop around a batch catches.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, *SERVER_ERRORS)
#: The transaction lost a race with another (a deadlock, a serialization failure):
#: worth running again as is.
LOST_RACE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)
#: The server was too busy to finish the statement in time (a lock or statement timeout).
BUSY_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,
)
#: A value no column can hold, refused by the server or already by the client encoding
#: the argument (which subclasses InterfaceError: catch these before CONNECTION_ERRORS).
UNSTORABLE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    ArgumentDataError,
)
#: The login lacks a grant the statement needs.
NOT_PERMITTED_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InsufficientPrivilegeError,
)
#: A table the statement names does not exist (a migration not applied).
NO_TABLE_ERRORS: tuple[type[BaseException], ...] = (asyncpg.exceptions.UndefinedTableError,)
#: A connection pool (what a role holds per database).
Pool: TypeAlias = asyncpg.Pool
#: A connection or a pool's proxy of one: what repository functions accept.
Conn = asyncpg.Connection | PoolConnectionProxy


def is_unique_violation(exc: BaseException, constraint: str) -> bool:
    """``exc`` is the server refusing a row that the unique ``constraint`` already holds."""
    return (
        isinstance(exc, asyncpg.UniqueViolationError)
        and getattr(exc, "constraint_name", None) == constraint
    )


async def fetch_backlog(conn: Conn, query: str, *args: Any) -> dict[str, Any]:
    """A backlog query's one row (the outbox's, an inbox's) as a dict in its columns' order,
    its ``oldest_at`` as ISO 8601 text (None when nothing waits)."""
    row = await conn.fetchrow(query, *args)
    assert row is not None
    backlog = dict(row)
    oldest = backlog["oldest_at"]
    backlog["oldest_at"] = oldest.isoformat() if oldest else None
    return backlog


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement and its arguments (``$1``…``$n``): a state change that travels
    as a single statement, i.e. one round trip and, alone, its own transaction.

    Any INSERT, UPDATE, DELETE or SELECT, with or without its own WITH clause (see
    :func:`with_ctes`, which prefixes more work to it).
    """

    sql: str
    args: tuple[Any, ...] = ()


#: A statement's own ``WITH`` (after any leading comments), merged by :func:`with_ctes`.
_LEADING_WITH = re.compile(
    r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*WITH(\s+RECURSIVE)?\b", re.IGNORECASE | re.DOTALL
)


def with_ctes(sql: str, ctes: str) -> str:
    """``sql`` with the common table expressions ``ctes`` (``name AS (…), …``) put
    before its own, if it has any.

    PostgreSQL runs every data-modifying CTE exactly once and to completion, whether or
    not the statement reads it — the ones the statement does not read, after the
    statement itself — all in the statement's one snapshot and transaction.
    """
    own_with = _LEADING_WITH.match(sql)
    if own_with is None:
        return f"WITH {ctes} {sql.strip()}"
    recursive = " RECURSIVE" if own_with.group(1) else ""
    return f"WITH{recursive} {ctes}, {sql[own_with.end() :].strip()}"


def redact(dsn: str) -> str:
    """``dsn`` without its password, for logs and errors."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


#: Where a role's DSN comes from, named in every error about one (a pod's log line must
#: say which setting to fix).
DSN_SETTINGS = "set by FERRY_DATABASES or FERRY_DSN_TEMPLATE"


@contextlib.contextmanager
def _connect_errors(dsn: str) -> Iterator[None]:
    """The driver's errors on connecting, translated to Ferry's kinds."""
    try:
        yield
    except asyncpg.exceptions.InvalidPasswordError as exc:
        raise ConfigurationError(
            f"{redact(dsn)} ({DSN_SETTINGS}): authentication failed: {exc}"
        ) from exc
    except asyncpg.exceptions.InvalidCatalogNameError as exc:
        raise ConfigurationError(f"{redact(dsn)} ({DSN_SETTINGS}): {exc}") from exc
    except asyncpg.exceptions.InvalidAuthorizationSpecificationError as exc:
        hint = (
            ": the server accepts this login over TLS only; add sslmode=verify-full and "
            "sslrootcert=<its CA file> to the DSN"
            if "no encryption" in str(exc)
            else ""
        )
        raise ConfigurationError(f"{redact(dsn)} ({DSN_SETTINGS}): refused: {exc}{hint}") from exc
    except ssl.SSLCertVerificationError as exc:
        # Retried (the role holds its work): a certificate is fixed on the server's side.
        raise TransientError(
            f"{redact(dsn)} ({DSN_SETTINGS}): TLS: the server's certificate was refused: "
            f"{exc.verify_message or exc} (the CA is the DSN's sslrootcert)"
        ) from exc
    except CONNECTION_ERRORS as exc:
        raise TransientError(f"{redact(dsn)} ({DSN_SETTINGS}): cannot connect: {exc}") from exc


async def connect(dsn: str, *, timeout: float = 10.0) -> asyncpg.Connection:
    """One connection, with driver errors translated to Ferry's kinds."""
    with _connect_errors(dsn):
        return await asyncpg.connect(dsn, timeout=timeout)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond asyncpg's own rollback of an open
    transaction (which runs before this).

    asyncpg's default sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release — a round trip per acquire, 6 % of the handler's CPU in
    the benchmark's profile. Ferry's code leaves no session state on pooled connections:
    no ``SET``, no session advisory lock, no cursor outside a transaction, and LISTEN runs
    on a dedicated connection (:mod:`shared.adapters.notify`).
    """


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> Pool:
    """A connection pool; see :func:`connect` for error translation."""
    with _connect_errors(dsn):
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=10.0,
            command_timeout=60.0,
            reset=_keep_session,
        )
    assert pool is not None
    return pool


async def create_default_pool(dsn: str, *, min_size: int, max_size: int) -> Pool:
    """A pool with asyncpg's own settings: no timeouts, no session reset, no error
    translation (what the handler SDK's ASGI app opens on the handler's own database)."""
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)
    assert pool is not None
    return pool


async def create_pool_when_up(dsn: str, *, max_size: int, stop: asyncio.Event) -> Pool:
    """A pool, retrying with back-off while the server is unreachable (a role starting first)."""
    delay = 0.2
    while True:
        try:
            pool = await create_pool(dsn, min_size=1, max_size=max_size)
        except TransientError as exc:
            hops.report("postgres", str(exc))
            if stop.is_set():
                raise
            log.warning("postgres not reachable (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        else:
            hops.clear("postgres")
            return pool


async def ensure_database(dsn: str) -> bool:
    """Create the database named in ``dsn`` if it is missing; True if it was created.

    Connects to the server's ``postgres`` database to do so, which needs CREATEDB.
    """
    parts = urlsplit(dsn)
    name = parts.path.lstrip("/")
    if not name:
        raise ConfigurationError(f"{redact(dsn)}: the DSN names no database")
    admin = await connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.exceptions.DuplicateDatabaseError:
            return False
        log.info("created database %s", name)
        return True
    finally:
        await admin.close()


@dataclass(frozen=True)
class Migration:
    """One SQL file of migrations/."""

    version: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        """sha256 of the file, to catch an applied migration edited afterwards."""
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every ``NNNN_name.sql`` file, in version order."""
    files = sorted(directory.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    if not files:
        raise ConfigurationError(f"{directory}: no migrations found")
    return [Migration(f.stem, f, f.read_text()) for f in files]


async def migrate(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    """Apply pending migrations in order, each in its own transaction; return their versions.

    Concurrent migrators are serialised by an advisory lock; an applied migration whose
    file changed since is an error, because the database no longer matches the tree.
    """
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS ferry_schema_migrations ("
        " version TEXT PRIMARY KEY, checksum TEXT NOT NULL,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        applied = {
            r["version"]: r["checksum"]
            for r in await conn.fetch("SELECT version, checksum FROM ferry_schema_migrations")
        }
        done: list[str] = []
        for migration in migrations:
            if migration.version in applied:
                _check_unchanged(migration, applied[migration.version])
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO ferry_schema_migrations (version, checksum) VALUES ($1, $2)",
                    migration.version,
                    migration.checksum,
                )
            done.append(migration.version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


def _check_unchanged(migration: Migration, recorded: str) -> None:
    if migration.checksum != recorded:
        raise ConfigurationError(
            f"{migration.path}: already applied with a different checksum; "
            "write a new migration instead of editing an applied one"
        )


async def migrate_database(dsn: str, *, create: bool = True) -> list[str]:
    """Create (optionally) and migrate one database; return the versions applied."""
    if create:
        await ensure_database(dsn)
    conn = await connect(dsn)
    try:
        return await migrate(conn, discover_migrations())
    finally:
        await conn.close()
