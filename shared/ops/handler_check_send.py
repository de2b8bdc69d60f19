"""Sending the calls of ``ferry handler-check``: the HTTP posts (one call, or a batch), each
answer read as the consumer reads it, and the effect query around them (``--effect-sql``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import aiohttp

from shared.adapters.postgres import SERVER_ERRORS, Conn
from shared.domain.ack import body_retryable
from shared.domain.batch_call import ANSWER_LIMIT
from shared.domain.errors import ConfigurationError
from shared.domain.retry_after import parse_retry_after
from shared.ops.handler_check_judge import Answer

#: Most bytes of an answer's body read (as the consumer reads them).
BODY_READ_LIMIT = 2000
#: Characters of an answer's body shown in the report.
DETAIL_SHOWN = 300


class Unreachable(Exception):
    """The handler (or the effect database) cannot be asked."""


class EffectProbe:
    """Runs the effect query on the handler's database (``--effect-sql``)."""

    def __init__(self, conn: Conn, sql: str) -> None:
        self.conn, self.sql = conn, sql

    async def value(self) -> str:
        """The query's result, as text (compared, never interpreted)."""
        try:
            rows = await self.conn.fetch(self.sql)
        except SERVER_ERRORS as exc:
            raise ConfigurationError(f"--effect-sql failed: {exc}") from None
        return json.dumps([list(r.values()) for r in rows], default=str)


async def call(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> Answer:
    """POST one call; :class:`Unreachable` when no connection can be made."""
    try:
        async with session.post(url, data=data, headers=headers, allow_redirects=False) as resp:
            head = await resp.content.read(BODY_READ_LIMIT)
            return _answer(resp.status, head, resp.headers.get("Retry-After"))
    except TimeoutError:
        return Answer(None, f"no answer within {session.timeout.total}s", "timeout")
    except aiohttp.ClientConnectorError as exc:
        raise Unreachable(f"cannot reach {url}: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}", "unreachable")


def _answer(status: int, head: bytes, retry_after: str | None) -> Answer:
    """An answer as the consumer reads it: detail, ``Retry-After``, ``retryable``."""
    text = " ".join(head.decode("utf-8", "replace").split())
    return Answer(
        status,
        text[:DETAIL_SHOWN],
        retry_after=parse_retry_after(retry_after, now=datetime.now(UTC)),
        retryable=body_retryable(head) if status >= 400 else None,
    )


async def post_batch(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]
) -> tuple[int | None, bytes]:
    """POST one batch call: the status and the body's head (None and why, when no
    answer came); :class:`Unreachable` when no connection can be made."""
    try:
        async with session.post(url, data=data, headers=headers, allow_redirects=False) as resp:
            return resp.status, await resp.content.read(ANSWER_LIMIT + 1)
    except TimeoutError:
        return None, b"no answer (timeout)"
    except aiohttp.ClientConnectorError as exc:
        raise Unreachable(f"cannot reach {url}: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}".encode()
