"""TLS for Ferry's HTTP hops (issue 47): a handler service or the console serving HTTPS, a
consumer calling its handler over HTTPS — and certificates rotated without a restart.

:class:`ServerTLS` makes the server's :class:`ssl.SSLContext` from a certificate and key
(and, for mutual TLS, the CA whose client certificates it requires); :func:`client_context`
the client's, which verifies the server against a CA (and may show a client certificate).
Both watch their files: :meth:`Reloading.watch` loads them again into the **same** context
when they change (cert-manager renews a mounted Secret in place), so new handshakes use the
new certificate while open connections go on — no restart, nothing in flight lost. New
files are tried in a scratch context first: a file that cannot be loaded (half-written, a
key that does not match) keeps the previous certificate in force and is logged, naming the
file. A CA file is *added to* what the context trusts: adding a new CA takes effect at
once, retiring one needs a restart.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from shared.domain.errors import ConfigurationError
from shared.waits import sleep_unless

log = logging.getLogger("ferry.tls")

#: Seconds between two looks at a certificate's files.
WATCH_INTERVAL = 5.0


def _stamp(paths: list[Path]) -> tuple[tuple[int, int], ...]:
    """What changes when a file is rewritten or replaced (mtime, inode)."""
    out = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            out.append((0, 0))
        else:
            out.append((st.st_mtime_ns, st.st_ino))
    return tuple(out)


@dataclass
class Reloading:
    """A context and the files it was loaded from; :meth:`watch` reloads them on change."""

    context: ssl.SSLContext
    #: Certificate and key (None: a client without a certificate of its own).
    cert: Path | None
    key: Path | None
    #: The CA it verifies peers with (None: the system's, or peers are not verified).
    ca: Path | None
    what: str
    _seen: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    def files(self) -> list[Path]:
        """The files it watches."""
        return [p for p in (self.cert, self.key, self.ca) if p is not None]

    def check(self) -> None:
        """Load the files into a scratch context: :class:`ConfigurationError` when they
        cannot be used (a key that does not match, a half-written file). OpenSSL replaces a
        context's certificate before it checks the key, so a bad pair loaded into the live
        context would leave it with no usable key; it is tried here first."""
        scratch = Reloading(ssl.SSLContext(self.context.protocol), self.cert, self.key,
                            self.ca, self.what)  # fmt: skip
        scratch._load()

    def load(self) -> None:
        """(Re)load the certificate chain and the CA into the context, once they are
        known to load (:meth:`check`)."""
        self.check()
        self._load()

    def _load(self) -> None:
        if self.cert is not None:
            try:
                self.context.load_cert_chain(str(self.cert), str(self.key) if self.key else None)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"{self.what}: certificate {self.cert} / key {self.key}: {exc}"
                ) from exc
        if self.ca is not None:
            try:
                self.context.load_verify_locations(cafile=str(self.ca))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"{self.what}: CA file {self.ca}: {exc}") from exc
        self._seen = _stamp(self.files())

    def changed(self) -> bool:
        """Whether a file changed since it was last loaded."""
        return _stamp(self.files()) != self._seen

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed; True when a new certificate is in force.
        A change that cannot be loaded leaves the previous one in force (logged)."""
        if not self.changed():
            return False
        try:
            self.load()
        except ConfigurationError as exc:
            self._seen = _stamp(self.files())  # logged once per change, not every look
            log.error("%s: the new files were not loaded, the previous stay in force: %s",
                      self.what, exc)  # fmt: skip
            return False
        log.info("%s: certificate reloaded from %s", self.what, self.cert or self.ca)
        return True

    async def watch(self, stop: asyncio.Event, interval: float = WATCH_INTERVAL) -> None:
        """Reload on change every ``interval`` seconds until ``stop``."""
        while not stop.is_set():
            await sleep_unless(stop, interval)
            if not stop.is_set():
                self.reload_if_changed()


def server_context(cert: Path, key: Path, *, client_ca: Path | None = None, what: str) -> Reloading:
    """An HTTPS server's context: TLS 1.2 or later, ``cert``/``key``; with ``client_ca``,
    every client must show a certificate that CA issued (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
    reloading = Reloading(context, cert, key, client_ca, what)
    reloading.load()
    return reloading


def client_context(
    ca: Path | None, *, cert: Path | None = None, key: Path | None = None, what: str
) -> Reloading:
    """A client's context that verifies the server (host name included) against ``ca``
    (None: the system's CAs), showing ``cert``/``key`` when given (mutual TLS)."""
    if key is not None and cert is None:
        raise ConfigurationError(f"{what}: a client key without its certificate")
    # With a CA of its own the context trusts that CA alone, not the system's as well.
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    reloading = Reloading(context, cert, key, ca, what)
    reloading.load()
    return reloading
