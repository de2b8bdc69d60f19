"""libpq-style DSNs (what every Ferry role uses) turned into JDBC URLs and properties.

``postgresql://user:secret@db.example:5433/sea?sslmode=require`` becomes the URL
``jdbc:postgresql://db.example:5433/sea?sslmode=require`` and the properties
``user``/``password`` (kept out of the URL, so logs and Spark's plans do not show them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    props = {"ApplicationName": APPLICATION_NAME}
    if parts.username:
        props["user"] = unquote(parts.username)
    if parts.password is not None:
        props["password"] = unquote(parts.password)
    query = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _PARAMS:
            raise ConfigurationError(
                f"{what}: query parameter {key!r} has no JDBC equivalent here "
                f"(supported: {', '.join(sorted(_PARAMS))})"
            )
        query[_PARAMS[key]] = value
    props.update({k: v for k, v in query.items() if k == "ApplicationName"})
    query.pop("ApplicationName", None)
    url = f"jdbc:postgresql://{host}:{port}/{quote(database, safe='')}"
    if query:
        url += "?" + urlencode(query)
    return JdbcTarget(database, url, props)


def sql_literal(text: str) -> str:
    """``text`` as a single-quoted SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
