"""JetStream as the roles and the ops see it: the types they annotate with, the errors
they catch (classified here, once), and the reads they configure.

Only the adapters (and :mod:`shared.access`) import nats-py. A role names a message a
:data:`JetStreamMsg` and catches :data:`NOT_FOUND_ERRORS`, never ``nats.js.errors``; the
connection itself is :data:`shared.adapters.nats.NatsClient` (see
:func:`shared.adapters.nats.connect_nats`). What counts as JetStream being away is in
:mod:`shared.adapters.transient`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeAlias

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as _Subscription
from nats.js import JetStreamContext
from nats.js import api as _api
from nats.js import errors as _js_errors

#: The JetStream API over a connection (``nc.jetstream()``): publish, fetch, infos.
JetStream: TypeAlias = JetStreamContext
#: A message as a subscription delivers it (a JetStream delivery carries ``metadata``).
JetStreamMsg: TypeAlias = Msg
#: A subscription on a connection (core NATS, or a JetStream push/ordered consumer).
Subscription: TypeAlias = _Subscription
#: A stream's acknowledgement of one publish.
PubAck: TypeAlias = _api.PubAck

#: Any error the NATS client raises, JetStream's among them.
NATS_CLIENT_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error,)
#: Whatever a call on the connection raises when it fails: the client's errors, the
#: socket's (OSError, TimeoutError among them).
NATS_FAILURES: tuple[type[BaseException], ...] = (*NATS_CLIENT_ERRORS, OSError)
#: No such stream, consumer or message (a message deleted, a durable gone).
NOT_FOUND_ERRORS: tuple[type[BaseException], ...] = (_js_errors.NotFoundError,)
#: A request (a fetch, a settlement) got no answer in time.
REQUEST_TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (nats.errors.TimeoutError,)
#: A request found the connection closed or nobody answering, or JetStream refused it
#: (an API error: no stream leader, among others).
REQUEST_FAILED_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoRespondersError,
    _js_errors.APIError,
)
#: JetStream's error code for "message size exceeds maximum allowed" (max_msg_size).
STREAM_MESSAGE_TOO_LARGE = 10054


def status_of(msg: JetStreamMsg) -> str | None:
    """The status of a pull request's status message (``"100"`` a heartbeat, ``"404"``
    no messages, ...); None for a delivered message."""
    status: str | None = JetStreamContext.is_status_msg(msg)
    return status


def over_max_payload(exc: BaseException) -> bool:
    """The publish was over the server's ``max_payload`` (refused by the client)."""
    return isinstance(exc, nats.errors.MaxPayloadError)


def api_error_codes(exc: BaseException) -> tuple[int | None, int | None] | None:
    """``(code, err_code)`` of a JetStream API error (503: no stream leader; err_code
    :data:`STREAM_MESSAGE_TOO_LARGE`, ...); None for any other exception."""
    if isinstance(exc, _js_errors.APIError):
        return exc.code, exc.err_code
    return None


def unavailable(err_code: int | None, description: str) -> Exception:
    """The error JetStream raises when a request finds no stream leader (503): to raise
    for an answer read by hand that says so."""
    error: Exception = _js_errors.ServiceUnavailableError(
        code=503, err_code=err_code, description=description
    )
    return error


def from_time(start: datetime, *, headers_only: bool | None = None) -> Any:
    """The configuration of an ordered consumer that reads from ``start`` on."""
    return _api.ConsumerConfig(
        deliver_policy=_api.DeliverPolicy.BY_START_TIME,
        opt_start_time=start,
        headers_only=headers_only,
    )


def from_sequence(seq: int, filters: list[str]) -> Any:
    """The configuration of an ordered consumer that reads the subjects ``filters`` take
    from stream sequence ``seq`` on."""
    return _api.ConsumerConfig(
        deliver_policy=_api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=seq,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
    )
