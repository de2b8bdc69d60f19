"""Per-role credentials of the local stack: NATS users and PostgreSQL logins, in files.

Before supervisord starts, :func:`write_role_credentials` creates (once; kept across
restarts) a random password per role in ``<var>/secrets`` (directory 0700, files 0600):
``nats-password-{role}``, ``pg-password-{role}`` and ``pgpass-{role}`` (a libpq password
file with that role's login only), and writes the nats-server authorization block
generated from the topologies. Each program of ``supervisord.conf`` gets its own role's
*paths* (``FERRY_NATS_PASSWORD_FILE``, ``?passfile=`` in its DSN), never a value, so no
password appears in the environment, in ``stack.env``, in a log or in ``ps``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from shared.access.identities import (
    DB_OWNER,
    NATS_ADMIN,
    SecretsDir,
    identities,
    pg_role_name,
    write_private,
)
from shared.access.nats_auth import DevAccess
from shared.contracts.topology import Topology

#: The nats-server authorization block (with passwords) inside the secrets directory.
AUTHORIZATION_NAME = "nats-authorization.conf"


def secrets_of(var_dir: Path) -> SecretsDir:
    """The stack's secrets directory."""
    return SecretsDir(var_dir / "secrets")


def check_var_dir(var_dir: Path) -> None:
    """Refuse a var directory whose database predates per-role logins (it trusts everyone
    and its tables belong to the superuser); a fresh one is made in seconds."""
    initialized = (var_dir / "pg" / "data" / "PG_VERSION").exists()
    if initialized and not secrets_of(var_dir).pg_password_file(DB_OWNER).exists():
        raise SystemExit(
            f"{var_dir} was created before per-role credentials: its PostgreSQL trusts every "
            "login and its tables belong to the superuser. Remove it (or pass another "
            "--var-dir) and start again."
        )


def pg_role_of(name: str) -> str:
    """The PostgreSQL login of a role identity name (the owner keeps its own name)."""
    return name if name == DB_OWNER else pg_role_name(name)


def write_role_credentials(var_dir: Path, topologies: list[Topology]) -> Path:
    """Create missing passwords, the pgpass files and the NATS authorization block; the
    block's path."""
    secrets = secrets_of(var_dir)
    access = DevAccess.create(topologies, secrets.root)
    names = [DB_OWNER, *sorted({i.name for t in topologies for i in identities(t)})]
    for name in names:
        password = secrets.ensure(secrets.pg_password_file(name))
        write_private(secrets.pgpass_file(name), f"*:*:*:{pg_role_of(name)}:{password}\n")
    path = secrets.root / AUTHORIZATION_NAME
    write_private(path, access.config())
    return path


def admin_nats_env(var_dir: Path) -> dict[str, str]:
    """The admin's NATS credentials (paths): bootstrap, the demo's operator, ``stack.env``."""
    return {
        "FERRY_NATS_USER": NATS_ADMIN,
        "FERRY_NATS_PASSWORD_FILE": str(secrets_of(var_dir).nats_password_file(NATS_ADMIN)),
    }


def login_dsn(dsn: str, name: str, secrets: SecretsDir) -> str:
    """``dsn`` (or a DSN template) as role ``name``'s login, its password in its passfile."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    query = "&".join(q for q in (parts.query, f"passfile={secrets.pgpass_file(name)}") if q)
    return urlunsplit(parts._replace(netloc=f"{pg_role_of(name)}@{host}", query=query))


def hostport(dsn: str) -> str:
    """``host:port`` of a DSN (the role DSNs of supervisord.conf are built on it)."""
    return urlsplit(dsn).netloc.rsplit("@", 1)[-1]
