"""Applying the plan of :mod:`shared.access.db_roles` to a server: the logins (SCRAM
verifiers, never a password in clear), the grants and row policies per database, in one
transaction per database. ``ferry db-roles`` and the local stack call :func:`apply_roles`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.access.db_roles import (
    FERRY_TABLES,
    ORDERING_TABLES,
    PAUSE_TABLE,
    PER_DURABLE_TABLES,
    REWIND_TABLE,
    SCRAM_ITERATIONS,
    THROTTLE_TABLES,
    RoleAccess,
    TableAccess,
    login_roles,
    plan,
)
from shared.access.identities import DB_OWNER
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError


def ident(name: str) -> str:
    """A double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    """A single-quoted SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def scram_verifier(password: str, *, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677)."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


#: Attributes of every login: no way to step outside its grants.
_LOGIN = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"


def role_sql(role: str, password: str | None, *, owner: bool = False) -> list[str]:
    """Create (if missing) and set the attributes and password of one login."""
    # The owner inherits: on PostgreSQL 15 and later the right to create in a database's
    # `public` schema comes through the implicit role pg_database_owner, which a NOINHERIT
    # owner does not use (`ferry migrate` as the owner failed "permission denied for schema
    # public" the first time the provisioning Job ran, on the podman overlay). It is a
    # member of no other role, so it inherits nothing else.
    attributes = (
        _LOGIN.replace("NOCREATEDB", "CREATEDB").replace("NOINHERIT", "INHERIT")
        if owner
        else _LOGIN
    )
    create = (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {literal(role)}) "
        f"THEN CREATE ROLE {ident(role)}; END IF; END $$"
    )
    alter = f"ALTER ROLE {ident(role)} WITH {attributes}"
    if password is not None:
        alter += f" PASSWORD {literal(scram_verifier(password))}"
    return [create, alter]


def _grant(access: RoleAccess, table: TableAccess) -> str:
    return f"GRANT {', '.join(table.privileges)} ON {table.table} TO {ident(access.role)}"


def _policy(access: RoleAccess, table: TableAccess) -> list[str]:
    name, role = ident(access.role), ident(access.role)
    rows = "ARRAY[" + ", ".join(literal(d) for d in table.durables or ()) + "]::text[]"
    check = f"durable = ANY({rows})"
    return [
        f"DROP POLICY IF EXISTS {name} ON {table.table}",
        f"CREATE POLICY {name} ON {table.table} TO {role} USING ({check}) WITH CHECK ({check})",
    ]


@dataclass
class DatabasePlan:
    """The statements that give one database's roles exactly their access."""

    database: str
    accesses: list[RoleAccess]
    #: Every login we manage (privileges on Ferry's tables are revoked from all of them).
    managed: list[str] = field(default_factory=list)

    def statements(self, existing_policies: list[tuple[str, str]]) -> list[str]:
        """SQL for this database; ``existing_policies`` are (table, policy) pairs found."""
        sql = [f"REVOKE ALL ON DATABASE {ident(self.database)} FROM PUBLIC"]
        every = ", ".join(FERRY_TABLES)
        for role in self.managed:
            sql.append(f"REVOKE ALL ON {every} FROM {ident(role)}")
            sql.append(f"REVOKE CREATE ON SCHEMA public FROM {ident(role)}")
            sql.append(f"REVOKE CONNECT, TEMPORARY ON DATABASE {ident(self.database)} "
                       f"FROM {ident(role)}")  # fmt: skip
        for name in (*PER_DURABLE_TABLES, *ORDERING_TABLES, *THROTTLE_TABLES, PAUSE_TABLE,
                     REWIND_TABLE):  # fmt: skip
            sql.append(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY")
        wanted = {(t.table, a.role) for a in self.accesses for t in a.tables if t.durables}
        managed = set(self.managed)
        for name, policy in existing_policies:
            if policy in managed and (name, policy) not in wanted:
                sql.append(f"DROP POLICY {ident(policy)} ON {name}")
        for access in self.accesses:
            sql.append(f"GRANT CONNECT ON DATABASE {ident(self.database)} TO {ident(access.role)}")
            if access.create_tables:
                sql.append(f"GRANT CREATE ON SCHEMA public TO {ident(access.role)}")
            for table in access.tables:
                sql.append(_grant(access, table))
                if table.durables is not None:
                    sql += _policy(access, table)
        return sql


#: A database name → an administrative DSN of it.
DsnOf = Callable[[str], str]
#: An identity name (or :data:`DB_OWNER`) → its password, or None to leave it unset.
PasswordOf = Callable[[str], str | None]


async def _policies(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT tablename, policyname FROM pg_policies WHERE schemaname = 'public'"
    )
    return [(r["tablename"], r["policyname"]) for r in rows]


async def apply_roles(
    topologies: list[Topology],
    dsn_of: DsnOf,
    password_of: PasswordOf,
    *,
    owner: bool = True,
    databases: Collection[str] | None = None,
    logins_only: bool = False,
) -> dict[str, list[str]]:
    """Create the logins and grant each database's access; database → roles granted there.

    ``databases`` limits the grants to those databases (default: all of the topologies);
    ``logins_only`` creates the logins and grants nothing (a fresh cluster: the owner must
    create and migrate the databases first). ``dsn_of`` must give a role that may create
    roles and grant on Ferry's tables (a superuser, or the owner with CREATEROLE). The
    statements are never logged: some hold a password verifier.
    """
    all_dbs = plan(topologies)
    by_db = {db: a for db, a in all_dbs.items() if databases is None or db in databases}
    if not all_dbs:
        return {}
    roles = sorted({i.pg_role: i.name for i in login_roles(topologies)}.items())
    first = await asyncpg.connect(_maintenance(dsn_of(next(iter(all_dbs)))))
    try:
        statements = role_sql(DB_OWNER, password_of(DB_OWNER), owner=True) if owner else []
        for role, name in roles:
            statements += role_sql(role, password_of(name))
        async with first.transaction():
            await first.execute(";\n".join(statements))  # one round trip
    finally:
        await first.close()
    done: dict[str, list[str]] = {}
    for database, accesses in {} if logins_only else by_db.items():
        conn = await _connect_existing(dsn_of(database), database)
        try:
            plan_ = DatabasePlan(database, accesses, [role for role, _ in roles])
            async with conn.transaction():
                await conn.execute(";\n".join(plan_.statements(await _policies(conn))))
        finally:
            await conn.close()
        done[database] = sorted({a.role for a in accesses})
    return done


def _maintenance(dsn: str) -> str:
    """``dsn`` pointed at the server's ``postgres`` database (roles are cluster-wide)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/postgres"))


async def _connect_existing(dsn: str, database: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(dsn)
    except asyncpg.exceptions.InvalidCatalogNameError:
        raise ConfigurationError(
            f"database {database!r} does not exist: create the logins first "
            f"(`ferry db-roles --logins-only`), migrate as {DB_OWNER} (`ferry migrate`), "
            "then run `ferry db-roles` again"
        ) from None
