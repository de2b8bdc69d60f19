"""What a failed publish of one outbox row means for that row (see :class:`outbox.Failure`).

Three kinds, because a long JetStream outage must never set events aside, while a row
that can never be published must not be retried forever in front of its aggregate:

* **cannot be published as it is** — set aside at once: the payload cannot be built into
  an envelope (``PAYLOAD_INVALID``: e.g. an integer of more digits than Python parses,
  written with plain SQL), or the message is larger than NATS or the stream accepts
  (``MESSAGE_TOO_LARGE``; sizes are the UTF-8 bytes that go out). Retrying changes
  nothing until the data or the limits change, and then an operator republishes it.
  On a partitioned stream, a row whose ordering key cannot be read (the payload lacks
  the event's ``ordering_key`` field, or it is not a string or an integer) has no
  partition: ``ORDERING_KEY_MISSING``.
* **outage** — JetStream did not answer (no PubAck in time, no responders, connection
  closed or reconnecting, no stream leader): says nothing about the row. Retried with
  the capped back-off for as long as it lasts; never sets a row aside.
* **refusal** — anything else (an unexpected error of the client or the server's
  answer): retried, and set aside after ``max_publish_attempts`` attempts
  (``PUBLISH_REFUSED``).
"""

from __future__ import annotations

from shared.adapters.jetstream import STREAM_MESSAGE_TOO_LARGE, api_error_codes, over_max_payload
from shared.adapters.outbox import MESSAGE_TOO_LARGE, PAYLOAD_INVALID, Failure
from shared.adapters.transient import PUBLISH_OUTAGES


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def unbuildable(exc: BaseException) -> Failure:
    """The row's payload (or fields) cannot be built into a message."""
    return Failure(
        f"cannot build the message: {_text(exc)}",
        set_aside=PAYLOAD_INVALID,
        kind=type(exc).__name__,
    )


#: Reason code of a row on a partitioned stream whose ordering key cannot be read.
ORDERING_KEY_MISSING = "ORDERING_KEY_MISSING"


def no_ordering_key(exc: BaseException) -> Failure:
    """The row's ordering key cannot be read, so it has no partition to go to."""
    return Failure(
        f"no partition: {exc}",
        set_aside=ORDERING_KEY_MISSING,
        kind=type(exc).__name__,
    )


def too_large(size: int, limit: int) -> Failure:
    """The message, as UTF-8 bytes with its headers, is over the stream's max_msg_size."""
    return Failure(
        f"message is {size} bytes (UTF-8 envelope and headers), over the stream's "
        f"max_msg_size of {limit} bytes",
        set_aside=MESSAGE_TOO_LARGE,
        kind="MessageTooLarge",
    )


def no_puback(timeout: float) -> Failure:
    """No PubAck within the publish timeout."""
    return Failure(f"no PubAck within {timeout}s", outage=True, kind="timeout")


def of_publish(exc: BaseException) -> Failure:
    """An exception raised by the publish or carried by its PubAck future."""
    text, kind = _text(exc), type(exc).__name__
    if over_max_payload(exc):
        return Failure(
            f"{text} (over the server's max_payload)", set_aside=MESSAGE_TOO_LARGE, kind=kind
        )
    codes = api_error_codes(exc)
    if codes is not None:
        code, err_code = codes
        if err_code == STREAM_MESSAGE_TOO_LARGE:
            return Failure(text, set_aside=MESSAGE_TOO_LARGE, kind=kind)
        if code == 503:  # no stream leader, stream temporarily unavailable
            return Failure(text, outage=True, kind=kind)
    return Failure(text, outage=isinstance(exc, PUBLISH_OUTAGES), kind=kind)


def wire_size(body: bytes, headers: dict[str, str]) -> int:
    """Bytes the stream stores for the message: its header block and its body."""
    if not headers:
        return len(body)
    block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return len(block.encode()) + len(body)
