"""NATS connection with the settings a long-running role needs.

nats-py's defaults are wrong for a role that must never silently stop (DESIGN §6a):
it gives up reconnecting after about two minutes, and with a two-minute ping interval a
black-holed link goes unnoticed for minutes. Every role connects through here.

Credentials and TLS come from :class:`NatsAuth` (built from settings by
:meth:`shared.runtime.settings.CommonSettings.nats_auth`). A server that refuses them ends the
first connection attempt at once with :class:`~shared.domain.errors.AccessDenied`
(roles exit 3), naming the server and the user, never the password: retrying a wrong
password forever would only hide the mistake.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client as NATS

from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.domain.reply_subjects import inbox_prefix
from shared.telemetry import hops

log = logging.getLogger("ferry.nats")

#: A connection to NATS, as :func:`connect_nats` opens it (``nc.jetstream()`` gives its
#: :data:`shared.adapters.jetstream.JetStream`).
NatsClient: TypeAlias = NATS

#: Pings missed before the client declares the link dead (interval x this = detection).
MAX_OUTSTANDING_PINGS = 3
#: Pause between reconnect attempts; reconnects never stop (-1).
RECONNECT_WAIT_SECONDS = 0.5
#: What the server says when it refuses the credentials (lower-cased).
_REFUSALS = ("authorization violation", "authentication expired", "authentication timeout")


@dataclass(frozen=True)
class NatsAuth:
    """Who a client is and how it secures the link; all optional (an open dev server).

    ``user``/``password``: a user of the server's ``authorization`` block;
    ``creds_file``: a JWT ``.creds`` file (operator mode); ``nkey_seed_file``: an nkey
    seed. ``tls_ca`` verifies the server, ``tls_cert``/``tls_key`` authenticate the client
    (mutual TLS); ``tls_handshake_first`` starts TLS before the server speaks (nothing,
    not even the INFO line, travels in clear; the server needs ``handshake_first``).
    """

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    creds_file: Path | None = None
    nkey_seed_file: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_handshake_first: bool = False

    def wants_tls(self, servers: list[str]) -> bool:
        """TLS when any URL says ``tls://`` or any TLS file is given."""
        schemes = {urlsplit(s).scheme for s in servers}
        return "tls" in schemes or any((self.tls_ca, self.tls_cert, self.tls_key))

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying client context (system CAs unless ``tls_ca``), with the client cert."""
        try:
            context = ssl.create_default_context(cafile=str(self.tls_ca) if self.tls_ca else None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"FERRY_NATS_TLS_CA {self.tls_ca}: {exc}") from exc
        if self.tls_cert is not None or self.tls_key is not None:
            if self.tls_cert is None:
                raise ConfigurationError("FERRY_NATS_TLS_KEY is set without FERRY_NATS_TLS_CERT")
            try:
                context.load_cert_chain(
                    str(self.tls_cert), str(self.tls_key) if self.tls_key else None
                )
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"FERRY_NATS_TLS_CERT {self.tls_cert} / FERRY_NATS_TLS_KEY {self.tls_key}: "
                    f"{exc}"
                ) from exc
        return context

    def options(self, servers: list[str]) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` for these credentials."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self.password
            # A private reply inbox: the server lets this user subscribe only below it.
            options["inbox_prefix"] = inbox_prefix(self.user)
        if self.creds_file is not None:
            options["user_credentials"] = str(_key_file(self.creds_file, "FERRY_NATS_CREDS_FILE"))
        if self.nkey_seed_file is not None:
            options["nkeys_seed"] = str(_key_file(self.nkey_seed_file, "FERRY_NATS_NKEY_SEED_FILE"))
        if self.wants_tls(servers):
            options["tls"] = self.ssl_context()
            options["tls_handshake_first"] = self.tls_handshake_first
        return options


def _key_file(path: Path, setting: str) -> Path:
    """A JWT/nkey file nats-py can use: it exists, and the ``nkeys`` package is there."""
    if importlib.util.find_spec("nkeys") is None:
        raise ConfigurationError(
            f"{setting} needs the nkeys package (pip install 'nats-py[nkeys]')"
        )
    if not path.is_file():
        raise ConfigurationError(f"{setting} {path}: no such file")
    return path


def redact_url(url: str) -> str:
    """``url`` without any user or password in it."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _refused(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(reason in text for reason in _REFUSALS)


class _Client(NATS):
    """nats-py's client, remembering whether its owner closed it (:meth:`close` or
    :meth:`drain`): nats-py calls the same disconnect callback for a close asked for and
    for a lost link, and only a lost link is worth a warning."""

    closing_on_purpose = False
    #: TLS is configured: upgrade every connection, whatever the server's INFO says.
    tls_only = False

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        """nats-py upgrades to TLS only when the server's INFO says ``tls_required``: a
        server that also takes plaintext (``allow_non_tls``), or anyone in the middle who
        strips the flag, would get the CONNECT, password included, in clear. With TLS
        configured the flag is set here, before nats-py decides (its INFO dict is the one
        it reads next), so the connection is TLS or fails."""
        await super()._process_info(info, initial_connection)
        if initial_connection and self.tls_only:
            self._server_info["tls_required"] = True

    async def close(self) -> None:
        self.closing_on_purpose = True
        await super().close()

    async def drain(self) -> None:
        self.closing_on_purpose = True
        await super().drain()


class _Events:
    """The connection's callbacks: log, report state, catch a refusal of the first attempt."""

    def __init__(self, on_state: Callable[[bool], None] | None) -> None:
        self.on_state = on_state
        self.connected = False
        self.last_error: str | None = None
        self.refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.client: _Client | None = None

    async def disconnected(self) -> None:
        if self.client is not None and self.client.closing_on_purpose:
            # Closed by its owner (a role stopping, `ferry where` done): nothing was lost.
            log.debug("nats connection closed", extra={"role_event": "nats_closed"})
        else:
            log.warning("nats disconnected", extra={"role_event": "nats_disconnected"})
        if self.on_state:
            self.on_state(False)

    async def reconnected(self) -> None:
        hops.clear("nats")
        log.info("nats reconnected")
        if self.on_state:
            self.on_state(True)

    async def error(self, exc: Exception) -> None:
        if not self.connected and _refused(exc):
            if not self.refused.done():
                self.refused.set_result(str(exc))
            return
        self.last_error = str(exc) or type(exc).__name__
        hops.report("nats", self.last_error)
        log.warning("nats error: %s", exc)


async def connect_nats(
    servers: list[str],
    *,
    name: str,
    ping_interval: float = 2.0,
    auth: NatsAuth | None = None,
    on_state: Callable[[bool], None] | None = None,
    give_up_after: float | None = None,
) -> NATS:
    """Connect, retrying the first connection; reconnect forever afterwards.

    ``on_state(connected)`` is called on every disconnect and reconnect (for /readyz).
    ``give_up_after`` bounds the wait for a reachable server (seconds; then
    :class:`TransientError`); None waits forever. Refused credentials raise
    :class:`AccessDenied` at once.
    """
    auth = auth or NatsAuth()
    events = _Events(on_state)
    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": RECONNECT_WAIT_SECONDS,
        "ping_interval": ping_interval,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "connect_timeout": 2,
        "disconnected_cb": events.disconnected,
        "reconnected_cb": events.reconnected,
        "error_cb": events.error,
        **auth.options(servers),
    }
    nc = _Client()
    nc.tls_only = auth.wants_tls(servers)
    events.client = nc
    attempt: asyncio.Future[Any] = asyncio.ensure_future(nc.connect(**options))
    waiting: set[asyncio.Future[Any]] = {attempt, events.refused}
    done, _ = await asyncio.wait(
        waiting, timeout=give_up_after, return_when=asyncio.FIRST_COMPLETED
    )
    if attempt in done:
        attempt.result()
        hops.clear("nats")
        events.connected = True
        if on_state:
            on_state(True)
        return nc
    attempt.cancel()
    await asyncio.gather(attempt, return_exceptions=True)
    await nc.close()
    where = ", ".join(redact_url(s) for s in servers)
    if events.refused.done():
        hops.report("nats", f"{where}: authorization violation")
        who = f"user {auth.user!r}" if auth.user else "an anonymous client"
        raise AccessDenied(
            f"NATS at {where} refused {who}: authorization violation "
            "(check FERRY_NATS_USER and FERRY_NATS_PASSWORD / _FILE, or the creds file)"
        )
    last = f" (last error: {events.last_error})" if events.last_error else ""
    raise TransientError(f"cannot reach NATS at {where} within {give_up_after}s{last}")
