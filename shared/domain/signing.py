"""Signed handler calls: HMAC-SHA256 over the timestamp, the durable and the exact body.

The inbox-consumer of a durable signs every ``POST /handle`` with that durable's secret;
the handler service verifies it and answers 401 to anything unsigned, forged, signed for
a durable it does not know, or older (or newer) than its tolerance — a captured request
replayed later is refused, and one replayed inside the window meets the handler's
idempotency (409). Headers:

``Ferry-Durable``    the calling durable (selects the secret)
``Ferry-Timestamp``  Unix seconds when the request was signed
``Ferry-Signature``  ``v1=<hex HMAC-SHA256(secret, "{timestamp}.{durable}." + body)>``
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

from shared.domain.errors import FerryError

DURABLE_HEADER = "Ferry-Durable"
TIMESTAMP_HEADER = "Ferry-Timestamp"
SIGNATURE_HEADER = "Ferry-Signature"
#: Seconds a signature stays acceptable either side of the handler's clock.
DEFAULT_TOLERANCE = 300.0
#: Unix seconds as the signer writes them: ASCII digits only (``int()`` would also take
#: "+1_700", " 17 " or other scripts' digits, and a thousand digits it cannot subtract).
_UNIX_SECONDS = re.compile(r"[0-9]{1,15}")


class SignatureError(FerryError):
    """Why a request's signature is refused (safe to return to the caller: no secret in it)."""


def signature(secret: bytes, timestamp: int, durable: str, body: bytes) -> str:
    """The ``Ferry-Signature`` value."""
    mac = hmac.new(secret, f"{timestamp}.{durable}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def sign(secret: bytes, durable: str, body: bytes, now: float) -> dict[str, str]:
    """Headers that authenticate ``body`` as sent by ``durable`` at ``now``."""
    timestamp = int(now)
    return {
        DURABLE_HEADER: durable,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secret, timestamp, durable, body),
    }


def verify(
    secrets: Mapping[str, bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str:
    """The authenticated durable; :class:`SignatureError` naming what is wrong otherwise."""
    durable = headers.get(DURABLE_HEADER)
    stamp = headers.get(TIMESTAMP_HEADER)
    given = headers.get(SIGNATURE_HEADER)
    if not (durable and stamp and given):
        missing = [
            name
            for name, value in (
                (DURABLE_HEADER, durable),
                (TIMESTAMP_HEADER, stamp),
                (SIGNATURE_HEADER, given),
            )
            if not value
        ]
        raise SignatureError(f"unsigned request: missing {', '.join(missing)}")
    secret = secrets.get(durable)
    if secret is None:
        raise SignatureError(f"no secret for durable {durable[:40]!r}")
    if not _UNIX_SECONDS.fullmatch(stamp):
        raise SignatureError(f"{TIMESTAMP_HEADER} {stamp[:40]!r} is not Unix seconds")
    timestamp = int(stamp)
    skew = now - timestamp
    if abs(skew) > tolerance:
        raise SignatureError(
            f"stale request: signed {skew:+.0f}s from now, tolerance is {tolerance:.0f}s"
        )
    # compare_digest refuses non-ASCII text with a TypeError: such a value cannot match.
    if not given.isascii() or not hmac.compare_digest(
        given, signature(secret, timestamp, durable, body)
    ):
        raise SignatureError("signature does not match the body")
    return durable
