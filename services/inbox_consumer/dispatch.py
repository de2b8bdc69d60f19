"""The HTTP event handler port (PORT-047-005): ``POST /handle`` with the envelope.

One pooled keep-alive session per process. Every failure to get an answer becomes a
:class:`HandlerFailure`; every answer a :class:`HandlerResponse`. Nothing raises.
With a secret, every request is signed (:mod:`shared.domain.signing`) over the exact
bytes sent.

Once the status line and headers are in, the status is the handler's answer; the body
is only its detail, read best-effort: at most :data:`BODY_READ_LIMIT` bytes, decoded as
UTF-8 with replacement characters and cut to :data:`DETAIL_LIMIT` characters. A body
that is not UTF-8, huge, reset mid-way or trickled past the timeout changes the detail,
never the outcome. ``Retry-After`` is read by :mod:`shared.domain.retry_after`; an
invalid one is ignored, logged once per message. A JSON object body's ``retryable`` flag
(INFRA-005 §3.1) is read from the same head (:func:`shared.domain.ack.body_retryable`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp

from shared.domain.ack import HandlerFailure, HandlerResponse, Outcome, body_retryable
from shared.domain.batch_call import ANSWER_LIMIT, read_batch_answer
from shared.domain.envelope import wire_json
from shared.domain.ports import BatchOutcome as BatchOutcome
from shared.domain.retry_after import parse_retry_after
from shared.domain.signing import sign
from shared.telemetry import hops

log = logging.getLogger("ferry.inbox_consumer")

#: What a POST's reader makes of the answer (see :meth:`HttpHandler._post`).
_Read = TypeVar("_Read")

#: How much of the handler's error body is kept (for last_error and dead letters).
DETAIL_LIMIT = 500
#: Most bytes of a handler's body read (4 per character covers any UTF-8 detail).
BODY_READ_LIMIT = 4 * DETAIL_LIMIT
#: Message ids remembered as already warned about an invalid Retry-After.
WARNED_LIMIT = 4096


class HttpHandler:
    """Calls one handler URL (the HTTP adapter of :class:`shared.domain.ports.HandlerPort`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        connections: int,
        durable: str = "",
        secret: bytes | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.url, self.timeout = url, timeout
        self.durable, self._secret = durable, secret
        # HTTPS (issue 47): ``tls`` verifies the handler (and may show our certificate);
        # kept-alive connections keep their session, so a call costs no handshake.
        connector = aiohttp.TCPConnector(
            limit=connections, keepalive_timeout=30, ssl=tls if tls is not None else True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout),
        )
        self._warned: OrderedDict[str, None] = OrderedDict()
        self._failing = False

    async def close(self) -> None:
        """Close the pooled connections."""
        await self._session.close()

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        """POST ``body``; return what happened."""
        key = headers.get("Idempotency-Key", "")
        return await self._post(body, headers, lambda resp: self._answer(resp, key))

    async def handle_batch(
        self, body: dict[str, Any], headers: dict[str, str], expected: list[uuid.UUID]
    ) -> BatchOutcome:
        """POST a batch call (:mod:`shared.domain.batch_call`) carrying ``expected``.

        A 200 is read whole (up to :data:`~shared.domain.batch_call.ANSWER_LIMIT` bytes)
        as the per-event results; any other answer, or none, is the outcome of every event.
        """
        first = str(expected[0]) if expected else ""

        async def read(resp: aiohttp.ClientResponse) -> BatchOutcome:
            if resp.status != 200:
                return await self._answer(resp, first)
            answer = await resp.content.read(ANSWER_LIMIT + 1)
            while len(answer) <= ANSWER_LIMIT:
                more = await resp.content.read(ANSWER_LIMIT + 1 - len(answer))
                if not more:
                    break
                answer += more
            return read_batch_answer(answer, expected)

        return await self._post(body, headers, read)

    async def _post(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        read: Callable[[aiohttp.ClientResponse], Awaitable[_Read]],
    ) -> _Read | HandlerFailure:
        """POST ``body`` (signed when there is a secret) and ``read`` the answer; no
        answer in time, or none at all, is a :class:`HandlerFailure`."""
        data = wire_json(body)
        headers = {**headers, "Content-Type": "application/json"}
        if self._secret is not None:
            headers.update(sign(self._secret, self.durable, data, time.time()))
        try:
            async with self._session.post(
                self.url, data=data, headers=headers, allow_redirects=False
            ) as resp:
                answer = await read(resp)
        except TimeoutError:
            return HandlerFailure("timeout", f"no answer within {self.timeout}s")
        except (aiohttp.ClientError, OSError) as exc:
            detail = _bounded(f"{type(exc).__name__}: {exc}")
            self._failing = True  # /readyz says why until a call gets through again
            hops.report("handler", f"{self.url}: {detail}")
            return HandlerFailure("unreachable", detail)
        except asyncio.CancelledError:
            raise
        if self._failing:
            self._failing = False
            hops.clear("handler")
        return answer

    async def _answer(self, resp: aiohttp.ClientResponse, message_id: str) -> HandlerResponse:
        """A non-batch answer: its status, Retry-After and (bounded) detail."""
        retry_after = self._retry_after(resp, message_id)
        detail, retryable = await _detail(resp)
        return HandlerResponse(resp.status, retry_after, detail, retryable)

    def _retry_after(self, resp: aiohttp.ClientResponse, message_id: str) -> float | None:
        """The header's seconds; an invalid value is ignored (logged once per message)."""
        raw = resp.headers.get("Retry-After")
        seconds = parse_retry_after(raw, now=datetime.now(UTC))
        if raw is not None and seconds is None and message_id not in self._warned:
            self._warned[message_id] = None
            if len(self._warned) > WARNED_LIMIT:
                self._warned.popitem(last=False)
            log.warning(
                "handler sent an invalid Retry-After %s (HTTP %s); the back-off ladder applies",
                _bounded(repr(raw), 80),
                resp.status,
                extra={"durable": self.durable, "message_id": message_id},
            )
        return seconds


async def _detail(resp: aiohttp.ClientResponse) -> tuple[str, bool | None]:
    """The head of the body, decoded safely (with what went wrong reading it, if anything),
    and its ``retryable`` flag when the whole body is a JSON object that has one."""
    head = b""
    try:
        while len(head) < BODY_READ_LIMIT:
            chunk = await resp.content.read(BODY_READ_LIMIT - len(head))
            if not chunk:
                break
            head += chunk
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        text = head.decode("utf-8", "replace")
        return _bounded(f"{text} [body unreadable: {type(exc).__name__}]".lstrip()), None
    retryable = body_retryable(head) if resp.status >= 400 else None
    return _bounded(head.decode("utf-8", "replace")), retryable


def _bounded(text: str, limit: int = DETAIL_LIMIT) -> str:
    """At most ``limit`` characters, without NUL (PostgreSQL text and jsonb refuse it)."""
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[: limit - 1] + "…"
