"""The HTTP event handler port (PORT-047-005): ``POST /handle`` with the envelope.

One pooled keep-alive session per process. Every failure to get an answer becomes a
:class:`HandlerFailure`; every answer a :class:`HandlerResponse`. Nothing raises.
With a secret, every request is signed (:mod:`shared.domain.signing`) over the exact
bytes sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from shared.domain.ack import HandlerFailure, HandlerResponse, Outcome
from shared.domain.signing import sign

#: How much of the handler's error body is kept (for last_error and dead letters).
DETAIL_LIMIT = 500


class HttpHandler:
    """Calls one handler URL."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        connections: int,
        durable: str = "",
        secret: bytes | None = None,
    ) -> None:
        self.url, self.timeout = url, timeout
        self.durable, self._secret = durable, secret
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=timeout),
        )

    async def close(self) -> None:
        """Close the pooled connections."""
        await self._session.close()

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        """POST ``body``; return what happened."""
        data = json.dumps(body, separators=(",", ":"), default=str).encode()
        headers = {**headers, "Content-Type": "application/json"}
        if self._secret is not None:
            headers.update(sign(self._secret, self.durable, data, time.time()))
        try:
            async with self._session.post(
                self.url, data=data, headers=headers, allow_redirects=False
            ) as resp:
                text = await resp.text()
                return HandlerResponse(
                    resp.status, _retry_after(resp.headers.get("Retry-After")), text[:DETAIL_LIMIT]
                )
        except TimeoutError:
            return HandlerFailure("timeout", f"no answer within {self.timeout}s")
        except (aiohttp.ClientError, OSError) as exc:
            return HandlerFailure("unreachable", f"{type(exc).__name__}: {exc}"[:DETAIL_LIMIT])
        except asyncio.CancelledError:
            raise


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the HTTP-date form is treated as absent)."""
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None
