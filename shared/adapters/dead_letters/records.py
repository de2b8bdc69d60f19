"""Dead-letter records on the wire: UTF-8 JSON that always fits, or the payload by reference.

A record carries the original message's payload so an operator (or any reader of the
dead-letter stream) sees what failed. The payload is already as large as the stream it
came from allows; the record adds its history and metadata, so a record can outgrow the
dead-letter stream. Publishing it would then fail on every attempt — and the message
would never be dead-lettered. Instead:

* records are UTF-8 JSON (no ASCII escapes: a Cyrillic character is 2 bytes, not 6);
* the limit is the smaller of the connection's ``max_payload`` (the server's INFO) and
  the dead-letter stream's ``max_msg_size`` (its stream info, when this process may read
  it; else learnt from the server's refusal, JetStream error 10054), less the headers;
* a record over the limit keeps the payload **by reference**: its sha256 digest, its size
  in bytes, where the original lives (stream and sequence) and where the full copy is
  kept (the ``dead_letters`` row of ``durable``/``message_id``, beside the inbox row).
  The replayer replays from that row, so a by-reference record replays like any other.

Every size here is a wire size: the UTF-8 bytes that go out.

The ``dead_letters`` row keeps the record as ``jsonb``, which refuses U+0000 and lone
surrogates. A payload holding either is stored exactly all the same — as base64 of its
bytes (:func:`stored_record`) — and replayed byte for byte (:func:`replay_body`); other
text (errors, history) is stored with a replacement character in their place
(:func:`storable`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from shared.domain.envelope import wire_json

log = logging.getLogger("ferry.dead_letters")

#: JetStream's error code for "message size exceeds maximum allowed" (stream max_msg_size).
MESSAGE_TOO_LARGE_CODE = 10054
#: Bytes kept free for the protocol line and headers nats-py adds (Nats-Expected-*, ...).
HEADROOM = 512
#: How long a stream's looked-up max_msg_size is trusted, in seconds.
LIMIT_TTL = 300.0
#: Retry-history entries a record keeps when even the by-reference record is too large.
HISTORY_KEPT = 20
#: Characters of lastError kept in that case.
ERROR_KEPT = 2000


def encode(doc: Any) -> bytes:
    """``doc`` as compact UTF-8 JSON; ASCII escapes only for what UTF-8 cannot carry
    (lone surrogates), so nothing is ever refused."""
    return wire_json(doc)


def header_bytes(headers: dict[str, str]) -> int:
    """Wire size of a NATS header block (``NATS/1.0\\r\\n`` + ``k: v\\r\\n`` … + ``\\r\\n``)."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


@dataclass(frozen=True)
class Fitted:
    """What is published: the bytes, and whether the payload went by reference."""

    data: bytes
    by_reference: bool


def payload_reference(record: dict[str, Any]) -> dict[str, Any]:
    """The by-reference stand-in for ``record["payload"]`` (see the module doc)."""
    body = encode(record.get("payload"))
    return {
        "by_reference": True,
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
        "original": {
            "stream": record.get("failedStream"),
            "stream_sequence": record.get("stream_sequence"),
        },
        "stored": {
            "table": "dead_letters",
            "durable": record.get("durable"),
            "message_id": record.get("message_id"),
        },
    }


def fit(record: dict[str, Any], limit: int, *, force_reference: bool = False) -> Fitted:
    """``record`` encoded within ``limit`` bytes: whole when it fits, else by reference."""
    data = encode(record)
    if len(data) <= limit and not force_reference:
        return Fitted(data, False)
    slim = {**record, "payload": payload_reference(record)}
    data = encode(slim)
    if len(data) > limit:  # history or error text alone too large: keep their tail
        history = list(record.get("retryHistory") or [])
        slim["retryHistory"] = history[-HISTORY_KEPT:]
        slim["retryHistoryOmitted"] = max(len(history) - HISTORY_KEPT, 0)
        slim["lastError"] = str(record.get("lastError") or "")[:ERROR_KEPT]
        data = encode(slim)
    return Fitted(data, True)


class RecordLimits:
    """The largest record body a dead-letter subject accepts, per dead-letter stream."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str], tuple[int, float]] = {}

    async def limit(self, js: JetStreamContext, stream: str | None, headers: int) -> int:
        """Body bytes allowed: min(max_payload, the stream's max_msg_size) less headers."""
        ceiling = _max_payload(js)
        if stream:
            size = await self._stream_limit(js, stream)
            if size is not None:
                ceiling = min(ceiling, size)
        return max(ceiling - headers - HEADROOM, 0)

    async def _stream_limit(self, js: JetStreamContext, stream: str) -> int | None:
        key = (_server_id(js), stream)
        known = self._streams.get(key)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        try:
            info = await js.stream_info(stream)
        except (NatsError, OSError) as exc:  # e.g. not permitted: the refusal teaches it
            log.debug("max_msg_size of %s unknown (%s)", stream, exc)
            return None
        size = int(info.config.max_msg_size or -1)
        value = size if size > 0 else 2**62
        self._streams[key] = (value, time.monotonic() + LIMIT_TTL)
        return value


#: One per process: stream limits are the same for every caller.
LIMITS = RecordLimits()


async def publish(
    js: JetStreamContext,
    subject: str,
    record: dict[str, Any],
    headers: dict[str, str],
    *,
    stream: str | None = None,
) -> Fitted:
    """Publish ``record`` on ``subject`` whole or by reference, never too large.

    A refusal for size (the stream's max_msg_size was not known here) is answered with the
    by-reference record; every other error is the caller's (transient: retry later).
    """
    limit = await LIMITS.limit(js, stream, header_bytes(headers))
    fitted = fit(record, limit)
    try:
        await js.publish(subject, fitted.data, headers=headers)
    except (APIError, MaxPayloadError) as exc:
        if fitted.by_reference or not _too_large(exc):
            raise
        log.info(
            "record of %s bytes refused for its size; keeping the payload by reference",
            len(fitted.data),
        )
        fitted = fit(record, limit, force_reference=True)
        await js.publish(subject, fitted.data, headers=headers)
    return fitted


def _too_large(exc: Exception) -> bool:
    if isinstance(exc, MaxPayloadError):
        return True
    return isinstance(exc, APIError) and exc.err_code == MESSAGE_TOO_LARGE_CODE


def _server_id(js: JetStreamContext) -> str:
    """The server (cluster member) this connection talks to: limits are per deployment."""
    info = getattr(getattr(js, "_nc", None), "_server_info", None)
    return str(info.get("server_id", "")) if isinstance(info, dict) else ""


def _max_payload(js: JetStreamContext) -> int:
    """The connection's max_payload, as the server announced it in INFO."""
    nc = getattr(js, "_nc", None)
    value = getattr(nc, "max_payload", None)
    return int(value) if isinstance(value, int) and value > 0 else 1024 * 1024


# --------------------------------------------------------------------------- the stored copy

#: Keys of a payload stored as base64 (no envelope has only these two).
STORED_AS = "stored_as"


def _fits_jsonb(text: str) -> bool:
    """JSON text PostgreSQL's jsonb accepts: no escaped NUL, no lone surrogate."""
    if "\\u0000" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable(value: Any) -> Any:
    """``value`` (JSON-like) as jsonb and text columns take it: NUL becomes U+FFFD, a lone
    surrogate ``?``."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if _fits_jsonb(text):
        return value
    cleaned = text.replace("\\u0000", "\\ufffd").encode("utf-8", "replace").decode()
    return json.loads(cleaned)


def stored_record(record: dict[str, Any]) -> str:
    """The JSON text of ``record`` for the ``dead_letters.record`` column (jsonb)."""
    text = json.dumps(record, ensure_ascii=False, default=str)
    if _fits_jsonb(text):
        return text
    exact = json.dumps(record.get("payload"), ensure_ascii=False, separators=(",", ":"))
    rest = storable({k: v for k, v in record.items() if k != "payload"})
    rest["payload"] = {
        STORED_AS: "base64",
        "data": base64.b64encode(exact.encode("utf-8", "surrogatepass")).decode(),
    }
    return json.dumps(rest, ensure_ascii=False, default=str)


def replay_body(record: dict[str, Any]) -> bytes | None:
    """The bytes a replay publishes: the stored envelope, or None when there is none."""
    payload = record.get("payload")
    if isinstance(payload, dict) and set(payload) == {STORED_AS, "data"}:
        body = base64.b64decode(payload["data"])
        doc = json.loads(body.decode("utf-8", "surrogatepass"))
        return body if isinstance(doc, dict) else None
    return encode(payload) if isinstance(payload, dict) else None
