"""libpq-style DSNs (what every Ferry role uses) turned into JDBC URLs and properties.

``postgresql://user:secret@db.example:5433/sea?sslmode=require`` becomes the URL
``jdbc:postgresql://db.example:5433/sea?sslmode=require`` and the properties
``user``/``password`` (kept out of the URL, so logs and Spark's plans do not show them).
A ``?passfile=`` (how the stack and Kubernetes hand each role its password) is read here,
since pgJDBC has none.

A multi-host DSN (a primary and its standby: ``postgresql://u@h1:5432,h2:5433/sea
?target_session_attrs=read-write``) keeps its hosts in order (``jdbc:postgresql://h1:5432,
h2:5433/sea?targetServerType=primary``); ``target_session_attrs`` is translated to the value
pgJDBC knows, and the passfile is searched for each host in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from shared.domain.errors import ConfigurationError

#: The driver class Spark loads from the jar.
DRIVER_CLASS = "org.postgresql.Driver"
#: libpq query parameters and their pgJDBC names (others are refused: better than ignored).
_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "target_session_attrs": "targetServerType",
    "options": "options",
}
#: libpq's ``target_session_attrs`` values and pgJDBC's ``targetServerType`` for each. pgJDBC's
#: ``primary`` takes a server whose sessions are not read-only (libpq's ``read-write`` and
#: ``primary``); its ``secondary`` one whose sessions are (``read-only``, ``standby``).
_TARGET_SERVER_TYPES = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}
#: How the job names itself to PostgreSQL (pg_stat_activity).
APPLICATION_NAME = "ferry-kpi-spark-job"


@dataclass(frozen=True)
class JdbcTarget:
    """A database as Spark's JDBC source wants it."""

    database: str
    url: str
    properties: dict[str, str] = field(repr=False)

    def options(self) -> dict[str, str]:
        """URL, driver and credentials as DataFrameReader options."""
        return {"url": self.url, "driver": DRIVER_CLASS, **self.properties}


def jdbc_target(dsn: str, *, what: str = "DSN") -> JdbcTarget:
    """Convert a ``postgresql://`` DSN; errors name ``what`` and the offending part."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        shown = scheme if sep else urlsplit(dsn).scheme
        raise ConfigurationError(f"{what}: scheme must be postgresql://, not {shown!r}")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hostlist = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    servers = _servers(hostlist, what=what)
    parts = urlsplit(f"{scheme}://x{tail}")
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(f"{what}: the DSN names no database")
    props = {"ApplicationName": APPLICATION_NAME}
    if at and user:
        props["user"] = unquote(user)
    if at and colon:
        props["password"] = unquote(password)
    query = _query(parts.query, what=what)
    passfile = query.pop("passfile", None)
    if passfile is not None and "password" not in props:
        found = _passfile_password(Path(passfile), servers, database, props.get("user", ""),
                                   what=what)  # fmt: skip
        if found is not None:
            props["password"] = found
    if "ApplicationName" in query:
        props["ApplicationName"] = query.pop("ApplicationName")
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in servers)
    url = f"jdbc:postgresql://{hosts}/{quote(database, safe='')}"
    if query:
        url += "?" + urlencode(query)
    return JdbcTarget(database, url, props)


def _servers(hostlist: str, *, what: str) -> list[tuple[str, int]]:
    """(host, port) of each entry of a DSN's ``h1[:p1],[v6][:p2],...``; port 5432 if none."""
    servers = []
    for entry in hostlist.split(","):
        if entry.startswith("["):
            host, bracket, after = entry[1:].partition("]")
            if not bracket or (after and not after.startswith(":")) or not host:
                raise ConfigurationError(f"{what}: host {entry!r} is not a valid [IPv6] address")
            port_text = after[1:] if after else ""
        else:
            host, _, port_text = entry.partition(":")
        host = unquote(host)
        if not host or host.startswith("/"):
            raise ConfigurationError(
                f"{what}: JDBC needs a TCP host (a Unix-socket DSN cannot be used by Spark)"
            )
        if port_text:
            if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
                raise ConfigurationError(
                    f"{what}: the port {port_text!r} of host {host!r} is not a number in 1..65535"
                )
            port = int(port_text)
        else:
            port = 5432
        servers.append((host, port))
    return servers


def _passfile_password(
    path: Path, servers: list[tuple[str, int]], database: str, user: str, *, what: str
) -> str | None:
    """The password the passfile gives for the first server that has one.

    JDBC sends one password to whichever host it connects to, so servers the passfile
    gives different passwords are refused (a failover would otherwise fail to log in)."""
    found: dict[str, str] = {}
    for host, port in servers:
        password = pgpass_password(path, host, port, database, user, what=what)
        if password is not None:
            found.setdefault(password, f"{host}:{port}")
    if len(found) > 1:
        raise ConfigurationError(
            f"{what}: passfile {path} gives different passwords for "
            f"{' and '.join(found.values())}; JDBC sends one password to every host"
        )
    return next(iter(found), None)


def _query(text: str, *, what: str) -> dict[str, str]:
    """The DSN's query parameters under their pgJDBC names (``passfile`` kept as is)."""
    query = {}
    for key, value in parse_qsl(text, keep_blank_values=True):
        if key == "passfile":
            query["passfile"] = value
        elif key == "target_session_attrs":
            if value not in _TARGET_SERVER_TYPES:
                raise ConfigurationError(
                    f"{what}: target_session_attrs={value!r} is not one pgJDBC can honour "
                    f"(accepted: {', '.join(_TARGET_SERVER_TYPES)})"
                )
            query["targetServerType"] = _TARGET_SERVER_TYPES[value]
        elif key in _PARAMS:
            query[_PARAMS[key]] = value
        else:
            raise ConfigurationError(
                f"{what}: query parameter {key!r} has no JDBC equivalent here "
                f"(supported: {', '.join(sorted([*_PARAMS, 'passfile']))})"
            )
    return query


def pgpass_password(
    path: Path, host: str, port: int, database: str, user: str, *, what: str
) -> str | None:
    """The password a libpq passfile (``host:port:database:user:password``) gives, if any.

    JDBC has no passfile, so the job reads it the way libpq does: first matching line,
    ``*`` matches anything, ``\\:`` and ``\\\\`` are escapes. Errors name the file, never a line.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigurationError(
            f"{what}: passfile {path} cannot be read: {exc.strerror}"
        ) from None
    wanted = (host, str(port), database, user)
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = _pgpass_fields(line)
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields, wanted, strict=False)):
            return fields[4]
    return None


def _pgpass_fields(line: str) -> list[str]:
    fields, current, escaped = [], "", False
    for char in line:
        if escaped:
            current, escaped = current + char, False
        elif char == "\\":
            escaped = True
        elif char == ":":
            fields.append(current)
            current = ""
        else:
            current += char
    return [*fields, current]


def sql_literal(text: str) -> str:
    """``text`` as a single-quoted SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
