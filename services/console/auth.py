"""Sign-in for the console: accounts with scrypt hashes, signed session cookies, CSRF tokens.

* **Accounts** come from a JSON file (``FERRY_CONSOLE_ACCOUNTS_FILE``):
  ``{"alice": {"role": "operator", "password": "scrypt$16384$8$1$<salt>$<hash>"}}``.
  The hash is :func:`hash_password`'s (``python -m services.console hash-password``);
  no password is ever stored or compared in clear.
* **A bearer token** (``FERRY_CONSOLE_TOKEN_FILE``) signs in a request carrying
  ``Authorization: Bearer <token>`` with ``FERRY_CONSOLE_TOKEN_ROLE``.
* **Sessions** are a cookie holding the user, the role, an expiry and a random nonce,
  signed with HMAC-SHA256 under a key from ``FERRY_CONSOLE_SESSION_KEY_FILE`` (or a random
  one per process). Nothing secret is in the cookie.
* **CSRF**: every form carries ``HMAC(key, "csrf:" + nonce)``; a POST signed in by cookie
  without the token of its session is refused.
* Five failed sign-ins of one name lock that name out for a minute.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from shared.domain.errors import ConfigurationError

Role = Literal["read-only", "operator"]
ROLES: tuple[Role, ...] = ("read-only", "operator")
#: scrypt cost: N=2**14, r=8, p=1 (16 MiB, tens of milliseconds), 32-byte key.
SCRYPT_N, SCRYPT_R, SCRYPT_P, KEY_BYTES = 2**14, 8, 1, 32
#: Failed sign-ins of one name before it is locked out, and for how long (seconds).
MAX_FAILURES, LOCKOUT = 5, 60.0
#: Prefix of the session cookie's name; each console adds its topology and port
#: (:func:`cookie_name`): cookies are not per port, so two consoles on one host would
#: otherwise overwrite each other's session.
COOKIE = "ferry_console"


def cookie_name(topology: str, port: int) -> str:
    """The session cookie's name of the console of ``topology`` on ``port``."""
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in topology)
    return f"{COOKIE}_{safe}_{port}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` of ``password`` (hashlib.scrypt, a random 16-byte salt)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    key = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=KEY_BYTES
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("not a scrypt$N$r$p$salt$hash password hash")
    n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
    if not (2 <= n <= 2**20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError("scrypt parameters out of range")
    return n, r, p, _unb64(parts[4]), _unb64(parts[5])


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded`` (compared in constant time)."""
    try:
        n, r, p, salt, key = _parse_hash(encoded)
    except (ValueError, TypeError):
        return False
    found = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(key), maxmem=2**26
    )
    return hmac.compare_digest(found, key)


#: Compared against when the name is unknown, so a wrong name costs what a wrong password does.
_DUMMY = hash_password("ferry-console-no-such-user", salt=b"0" * 16)


@dataclass(frozen=True)
class Account:
    """One operator account."""

    name: str
    role: Role
    password_hash: str


def load_accounts(path: Path | None) -> dict[str, Account]:
    """The accounts of ``path`` (none when unset); errors name the file, never a hash."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"console accounts {path}: cannot read: {exc.strerror}") from None
    except ValueError:
        raise ConfigurationError(f"console accounts {path}: not JSON") from None
    if not isinstance(doc, dict):
        raise ConfigurationError(f"console accounts {path}: expected an object of accounts")
    accounts = {}
    for name, entry in doc.items():
        if not isinstance(entry, dict) or entry.get("role") not in ROLES:
            raise ConfigurationError(
                f"console accounts {path}: {name!r} needs a role, one of {', '.join(ROLES)}"
            )
        try:
            _parse_hash(str(entry.get("password", "")))
        except ValueError as exc:
            raise ConfigurationError(f"console accounts {path}: {name!r}: {exc}") from None
        accounts[str(name)] = Account(str(name), entry["role"], str(entry["password"]))
    return accounts


@dataclass(frozen=True)
class Session:
    """Who is signed in: name, role, when it ends, and the nonce the CSRF token is bound to."""

    user: str
    role: Role
    expires: float
    nonce: str
    via: Literal["cookie", "token"] = "cookie"

    @property
    def may_act(self) -> bool:
        """Operators may replay, park and discard; read-only users may only look."""
        return self.role == "operator"

    @property
    def actor(self) -> str:
        """Who, in the audit tables: ``NAME@console``."""
        return f"{self.user}@console"


class Authenticator:
    """Checks passwords and tokens, signs and reads session cookies, issues CSRF tokens."""

    def __init__(
        self,
        accounts: dict[str, Account],
        *,
        key: bytes | None = None,
        token: str | None = None,
        token_role: Role = "read-only",
        ttl: float = 8 * 3600.0,
    ) -> None:
        self.accounts = accounts
        self._key = key if key is not None else secrets.token_bytes(32)
        self._token = token
        self._token_role = token_role
        self.ttl = ttl
        self._failures: dict[str, tuple[int, float]] = {}

    @property
    def configured(self) -> bool:
        """Whether anyone can sign in at all."""
        return bool(self.accounts) or self._token is not None

    def _mac(self, data: bytes) -> str:
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest())

    def locked(self, user: str) -> bool:
        """Whether ``user`` failed too often lately."""
        count, since = self._failures.get(user, (0, 0.0))
        return count >= MAX_FAILURES and time.monotonic() - since < LOCKOUT

    def sign_in(self, user: str, password: str) -> Session | None:
        """A new session when the password is right (and the name not locked out)."""
        if self.locked(user):
            return None
        account = self.accounts.get(user)
        ok = verify_password(password, account.password_hash if account else _DUMMY)
        if account is None or not ok:
            count, _ = self._failures.get(user, (0, 0.0))
            self._failures[user] = (count + 1, time.monotonic())
            return None
        self._failures.pop(user, None)
        return Session(user, account.role, time.time() + self.ttl, secrets.token_urlsafe(16))

    def cookie(self, session: Session) -> str:
        """The signed cookie value of ``session``."""
        body = _b64(
            json.dumps(
                {"u": session.user, "r": session.role, "e": session.expires, "n": session.nonce},
                separators=(",", ":"),
            ).encode()
        )
        return f"{body}.{self._mac(body.encode())}"

    def from_cookie(self, value: str | None) -> Session | None:
        """The session of a cookie, or None (unsigned, tampered, expired, account gone)."""
        if not value or "." not in value:
            return None
        body, mac = value.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac(body.encode())):
            return None
        try:
            doc: Any = json.loads(_unb64(body))
            user, role, expires, nonce = doc["u"], doc["r"], float(doc["e"]), str(doc["n"])
        except (ValueError, KeyError, TypeError):
            return None
        account = self.accounts.get(user)
        if expires < time.time() or account is None or account.role != role:
            return None
        return Session(user, role, expires, nonce)

    def from_bearer(self, header: str | None) -> Session | None:
        """The session of an ``Authorization: Bearer`` header carrying the token."""
        if self._token is None or not header or not header.startswith("Bearer "):
            return None
        if not hmac.compare_digest(header[7:].strip().encode(), self._token.encode()):
            return None
        return Session("token", self._token_role, time.time() + 60, "", via="token")

    def seal(self, text: str) -> str:
        """``text`` signed, as a cookie value (a one-time message: :meth:`unseal`)."""
        body = _b64(text.encode())
        return f"{body}.{self._mac(b'note:' + body.encode())}"

    def unseal(self, value: str | None) -> str | None:
        """The text :meth:`seal` signed, or None (absent, tampered)."""
        if not value or "." not in value:
            return None
        body, mac = value.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac(b"note:" + body.encode())):
            return None
        try:
            return _unb64(body).decode()
        except ValueError:
            return None

    def csrf_token(self, session: Session) -> str:
        """The CSRF token forms of ``session`` carry."""
        return self._mac(b"csrf:" + session.nonce.encode())

    def check_csrf(self, session: Session, token: str | None) -> bool:
        """Whether ``token`` is ``session``'s (a bearer request needs none: no cookie)."""
        if session.via == "token":
            return True
        return bool(token) and hmac.compare_digest(str(token), self.csrf_token(session))


def read_secret_file(path: Path | None, what: str) -> str | None:
    """A secret's value from its file (stripped), or None when unset; errors name the file."""
    if path is None:
        return None
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigurationError(f"{what} {path}: cannot read: {exc.strerror}") from None
    if not value:
        raise ConfigurationError(f"{what} {path} is empty")
    return value
