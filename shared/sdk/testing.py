"""A test client that calls a handler as the inbox-consumer does: signed, over HTTP.

For a team's own tests (and ``ferry handler-check``)::

    async with SigningClient(url, durable="billing__from_shop", secret=b"s3cret") as ferry:
        call = ferry.call("order_paid", 1, {"order_id": "o-1"}, context="shop")
        assert (await ferry.send(call)).status == 200
        assert (await ferry.send(call.again())).status == 409

:func:`handler_call` builds the exact document the consumer sends
(:mod:`shared.domain.handler_call`); :func:`signed_headers` signs bytes as the consumer
does (:mod:`shared.domain.signing`), so any HTTP client can be used instead.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import aiohttp

from shared.domain.batch_call import batch_document, batch_headers
from shared.domain.envelope import Envelope, wire_json
from shared.domain.handler_call import request_body, request_headers
from shared.domain.signing import sign


@dataclass(frozen=True, slots=True)
class HandlerCall:
    """One call: the envelope and its delivery (what the body is built from)."""

    envelope: Envelope
    attempt: int = 1
    max_attempts: int = 5
    stream_sequence: int = 1
    durable: str = "test"
    traceparent: str | None = None

    @property
    def message_id(self) -> str:
        """The event id, also the ``Idempotency-Key``."""
        return self.envelope.message_id

    def document(self) -> dict[str, Any]:
        """The JSON body as the consumer sends it."""
        return request_body(
            self.envelope,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            stream_sequence=self.stream_sequence,
            durable=self.durable,
        )

    def body(self) -> bytes:
        """The body's bytes (UTF-8 JSON, as the consumer writes it)."""
        return wire_json(self.document())

    def headers(self) -> dict[str, str]:
        """The unsigned headers."""
        return {
            **request_headers(self.message_id, self.traceparent),
            "Content-Type": "application/json",
        }

    def again(self) -> HandlerCall:
        """The next delivery of the same message (a redelivery: same id, attempt + 1)."""
        return dataclasses.replace(self, attempt=self.attempt + 1)

    def with_payload(self, payload: dict[str, Any]) -> HandlerCall:
        """The same message with another payload (digest recomputed)."""
        envelope = dataclasses.replace(self.envelope, payload=payload, payload_digest="")
        return dataclasses.replace(self, envelope=envelope)


def handler_call(
    event_type: str,
    version: int,
    payload: dict[str, Any],
    *,
    context: str = "test",
    namespace: str | None = None,
    message_id: str | None = None,
    attempt: int = 1,
    max_attempts: int = 5,
    durable: str = "test",
    aggregate_type: str = "test",
    aggregate_id: str = "a1",
    correlation_id: str | None = None,
    traceparent: str | None = None,
    occurred_at: datetime | None = None,
) -> HandlerCall:
    """A call of ``event_type`` v``version`` carrying ``payload``, produced by ``context``
    (published on ``{namespace}.{event_type}.v{version}``, namespace ``{context}.event``
    by default)."""
    subject = f"{namespace or context + '.event'}.{event_type}.v{version}"
    envelope = Envelope(
        message_id=message_id or str(uuid.uuid4()),
        subject=subject,
        event_type=event_type,
        event_version=version,
        occurred_at=occurred_at or datetime.now(UTC),
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        payload=payload,
        context=context,
        correlation_id=correlation_id,
    )
    return HandlerCall(
        envelope,
        attempt=attempt,
        max_attempts=max_attempts,
        durable=durable,
        traceparent=traceparent,
    )


def batch_body(calls: list[HandlerCall]) -> tuple[bytes, dict[str, str]]:
    """The body and (unsigned) headers of a batch call carrying ``calls``, as the consumer
    builds them (:mod:`shared.domain.batch_call`)."""
    events = []
    for call in calls:
        event = call.document()
        if call.traceparent:
            event["traceparent"] = call.traceparent
        events.append(event)
    headers = {**batch_headers(len(calls)), "Content-Type": "application/json"}
    return wire_json(batch_document(events)), headers


def batch_results(reply: Reply) -> dict[str, dict[str, Any]]:
    """A batch reply's results by event id (fails when an id has several)."""
    found: dict[str, dict[str, Any]] = {}
    for result in (reply.body or {}).get("results", []):
        if result["id"] in found:
            raise AssertionError(f"two results for {result['id']}")
        found[result["id"]] = result
    return found


def signed_headers(
    secret: bytes, durable: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """``Ferry-Durable``, ``Ferry-Timestamp`` and ``Ferry-Signature`` for ``body``."""
    return sign(secret, durable, body, time.time() if now is None else now)


@dataclass
class Reply:
    """A handler's answer, read fully."""

    status: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def body(self) -> Any:
        """The JSON body (None when there is none or it is not JSON)."""
        try:
            return json.loads(self.text) if self.text else None
        except ValueError:
            return None


class SigningClient:
    """Calls one handler URL as durable ``durable`` signing with ``secret``
    (None: unsigned, for a handler started with ``allow_unsigned``)."""

    def __init__(
        self, url: str, *, durable: str, secret: bytes | None, timeout: float = 10.0
    ) -> None:
        self.url, self.durable, self.secret = url, durable, secret
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SigningClient:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def call(
        self, event_type: str, version: int, payload: dict[str, Any], **kw: Any
    ) -> HandlerCall:
        """:func:`handler_call` delivered to this client's durable."""
        kw.setdefault("durable", self.durable)
        return handler_call(event_type, version, payload, **kw)

    async def send(
        self,
        call: HandlerCall,
        *,
        sign: bool = True,
        secret: bytes | None = None,
        signed_at: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """POST ``call``; signed unless ``sign=False``, with another ``secret`` or at
        another moment (``signed_at``, Unix seconds: an expired signature) if given."""
        return await self.post(
            call.body(),
            {**call.headers(), **(headers or {})},
            sign=sign,
            secret=secret,
            signed_at=signed_at,
        )

    async def send_batch(
        self, calls: list[HandlerCall], *, sign: bool = True, signed_at: float | None = None
    ) -> Reply:
        """POST ``calls`` as one batch call (:func:`batch_body`), as a durable with
        ``handler.batch`` >= 2 does; the reply's body holds one result per event."""
        body, headers = batch_body(calls)
        return await self.post(body, headers, sign=sign, signed_at=signed_at)

    async def post(
        self,
        body: bytes,
        headers: dict[str, str],
        *,
        sign: bool = True,
        secret: bytes | None = None,
        signed_at: float | None = None,
    ) -> Reply:
        """POST raw ``body`` (signed as :meth:`send` does): for malformed requests."""
        if self._session is None:
            raise RuntimeError("use the client as 'async with SigningClient(...)'")
        key = secret if secret is not None else self.secret
        if sign and key is not None:
            headers = {**headers, **signed_headers(key, self.durable, body, now=signed_at)}
        async with self._session.post(
            self.url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            text = await resp.text(errors="replace")
            return Reply(resp.status, text, dict(resp.headers))
