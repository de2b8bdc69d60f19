"""The HandlerPort contract (:class:`shared.domain.ports.HandlerPort`), per implementation.

The real adapter is the consumer's :class:`~services.inbox_consumer.dispatch.HttpHandler`
calling an HTTP handler served in the test; the fake is
:class:`shared.adapters.memory_handler.ScriptedHandler`. Each backend is told what the handler
answers for a message id (``answer``), so the suite asserts only what the port promises.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from services.inbox_consumer.dispatch import HttpHandler
from shared.adapters.memory_handler import ScriptedHandler
from shared.domain.ack import HandlerFailure, HandlerResponse, Outcome
from shared.domain.ports import HandlerPort

#: The real adapter's timeout: a handler slower than this is a ``timeout`` failure.
TIMEOUT = 0.5


@dataclass
class HandlerBackend:
    """A handler port, and how to make its handler answer ``outcome`` for a message id."""

    port: HandlerPort
    answer: Callable[[str, Outcome], None]


def _scripting(script: dict[str, list[Outcome]]) -> Callable[[str, Outcome], None]:
    return lambda mid, outcome: script.setdefault(mid, []).append(outcome)


@pytest.fixture(params=["http", "memory"])
async def handler_backend(request: pytest.FixtureRequest) -> AsyncIterator[HandlerBackend]:
    if request.param == "memory":
        fake = ScriptedHandler()
        yield HandlerBackend(fake, _scripting(fake.script))
        return
    script: dict[str, list[Outcome]] = {}

    async def handle(req: web.Request) -> web.Response:
        answers = script.get(req.headers.get("Idempotency-Key", ""))
        outcome = answers.pop(0) if answers else HandlerResponse(200)
        if isinstance(outcome, HandlerFailure):
            await asyncio.sleep(TIMEOUT * 4)  # only a timeout can be served
            return web.Response(status=200)
        headers = {}
        if outcome.retry_after is not None:
            headers["Retry-After"] = str(int(outcome.retry_after))
        return web.Response(status=outcome.status, text=outcome.detail, headers=headers)

    app = web.Application()
    app.router.add_post("/handle", handle)
    server = TestServer(app)
    await server.start_server()
    port = HttpHandler(str(server.make_url("/handle")), timeout=TIMEOUT, connections=4)
    yield HandlerBackend(port, _scripting(script))
    await port.close()
    await server.close()


def _call(message_id: str) -> tuple[dict[str, Any], dict[str, str]]:
    return {"message_id": message_id}, {"Idempotency-Key": message_id}


async def test_each_answer_is_a_response_with_its_status_and_retry_after(
    handler_backend: HandlerBackend,
) -> None:
    mid = str(uuid.uuid4())
    handler_backend.answer(mid, HandlerResponse(503, retry_after=7.0))
    first = await handler_backend.port.handle(*_call(mid))
    again = await handler_backend.port.handle(*_call(mid))
    assert isinstance(first, HandlerResponse) and isinstance(again, HandlerResponse)
    assert (first.status, first.retry_after) == (503, 7.0)
    assert again.status == 200


async def test_no_answer_is_a_failure_never_an_exception(handler_backend: HandlerBackend) -> None:
    mid = str(uuid.uuid4())
    handler_backend.answer(mid, HandlerFailure("timeout"))
    outcome = await handler_backend.port.handle(*_call(mid))
    assert isinstance(outcome, HandlerFailure) and outcome.kind == "timeout"


async def test_a_batch_call_refused_is_one_outcome_for_every_event(
    handler_backend: HandlerBackend,
) -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    key = str(ids[0])  # the batch call is keyed by its first event
    handler_backend.answer(key, HandlerResponse(503))
    body = {"events": [{"message_id": str(i)} for i in ids]}
    outcome = await handler_backend.port.handle_batch(body, {"Idempotency-Key": key}, ids)
    assert isinstance(outcome, HandlerResponse) and outcome.status == 503
