"""libpq-style DSNs (what every Ferry role uses) turned into JDBC URLs and properties.

``postgresql://user:secret@db.example:5433/sea?sslmode=require`` becomes the URL
``jdbc:postgresql://db.example:5433/sea?sslmode=require`` and the properties
``user``/``password`` (kept out of the URL, so logs and Spark's plans do not show them).
A ``?passfile=`` (how the stack and Kubernetes hand each role its password) is read here,
since pgJDBC has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit

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
    parts = urlsplit(dsn)
    host, port, database = _address(parts, what=what)
    props = {"ApplicationName": APPLICATION_NAME}
    if parts.username:
        props["user"] = unquote(parts.username)
    if parts.password is not None:
        props["password"] = unquote(parts.password)
    query = _query(parts.query, what=what)
    passfile = query.pop("passfile", None)
    if passfile is not None and "password" not in props:
        found = pgpass_password(Path(passfile), str(parts.hostname), port, database,
                                props.get("user", ""), what=what)  # fmt: skip
        if found is not None:
            props["password"] = found
    if "ApplicationName" in query:
        props["ApplicationName"] = query.pop("ApplicationName")
    url = f"jdbc:postgresql://{host}:{port}/{quote(database, safe='')}"
    if query:
        url += "?" + urlencode(query)
    return JdbcTarget(database, url, props)


def _address(parts: SplitResult, *, what: str) -> tuple[str, int, str]:
    """(host as it goes in a URL, port, database) of a DSN, or why not."""
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"{what}: scheme must be postgresql://, not {parts.scheme!r}")
    if not parts.hostname:
        raise ConfigurationError(
            f"{what}: JDBC needs a TCP host (a Unix-socket DSN cannot be used by Spark)"
        )
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigurationError(f"{what}: the DSN names no database")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    try:
        port = parts.port or 5432
    except ValueError:
        raise ConfigurationError(f"{what}: the port is not a number") from None
    return host, port, database


def _query(text: str, *, what: str) -> dict[str, str]:
    """The DSN's query parameters under their pgJDBC names (``passfile`` kept as is)."""
    query = {}
    for key, value in parse_qsl(text, keep_blank_values=True):
        if key == "passfile":
            query["passfile"] = value
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
