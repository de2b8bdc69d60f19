"""The signature check both adapters run before anything else (401 on any failure).

Secrets are per calling durable: ``{"durable": b"secret"}``. :func:`load_secrets` reads
them as Ferry's own services do, from ``FERRY_HANDLER_SECRETS`` (JSON) or the file named
by ``FERRY_HANDLER_SECRETS_FILE`` (a mounted Kubernetes Secret; it wins when both are set).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from shared.domain.errors import ConfigurationError
from shared.domain.signing import DEFAULT_TOLERANCE, SignatureError, verify

from .outcomes import Outcome


def authenticate(
    secrets: Mapping[str, bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> Outcome | None:
    """None when the call is signed by a known durable within ``tolerance`` seconds;
    else the 401 to answer, naming what is wrong (never a secret)."""
    try:
        verify(secrets, headers, body, now=time.time() if now is None else now, tolerance=tolerance)
    except SignatureError as exc:
        return Outcome.unauthenticated(str(exc))
    return None


def parse_secrets(text: str, *, source: str) -> dict[str, bytes]:
    """``{"durable": "secret", ...}`` as durable → secret bytes (:class:`ConfigurationError`
    naming ``source`` otherwise; the message never shows a secret)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source}: not JSON (line {exc.lineno})") from None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in doc.items()
    ):
        raise ConfigurationError(f"{source}: must map durable names to non-empty secrets")
    return {k: v.encode() for k, v in doc.items()}


def load_secrets(environ: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """The verification secrets from the environment; empty when neither variable is set
    (the adapters then refuse to start unless told ``allow_unsigned=True``)."""
    env = os.environ if environ is None else environ
    path = env.get("FERRY_HANDLER_SECRETS_FILE")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"FERRY_HANDLER_SECRETS_FILE {path}: cannot read: {exc.strerror}"
            ) from exc
        return parse_secrets(text, source=f"FERRY_HANDLER_SECRETS_FILE {path}")
    raw = env.get("FERRY_HANDLER_SECRETS")
    return parse_secrets(raw, source="FERRY_HANDLER_SECRETS") if raw else {}


def require_secrets(secrets: Mapping[str, bytes] | None, *, allow_unsigned: bool) -> None:
    """Refuse to serve unauthenticated unless the caller said so explicitly."""
    if not secrets and not allow_unsigned:
        raise ConfigurationError(
            "no verification secrets: give secrets= (load_secrets() reads "
            "FERRY_HANDLER_SECRETS), or allow_unsigned=True for a test"
        )
