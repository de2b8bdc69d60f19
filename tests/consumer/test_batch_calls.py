"""Batch handler calls (``handler: {batch: N}``) end to end: the real consumer, a real
aiohttp handler that answers one result per event, real NATS and PostgreSQL.

The handler here is the independent record: it counts its POSTs, every event it is sent
and every effect it applies (each id applied once, 409 after), so the tests count
effects against what was published, not against what the consumer believes.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from nats.aio.client import Client as NATS

from devstack.ports import free_port
from shared.access.streams import provision
from shared.domain.batch_call import BATCH_HEADER
from shared.domain.handler_call import request_body
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    RunningConsumer,
    dead_letters,
    envelope,
    fast_durable,
    inbox_row,
    publish,
    serving,
)
from tests.consumer.hostile import until_all
from tests.helpers import RunningRouter

pytestmark = pytest.mark.integration

#: A scripted result: a result entry (dict, "id" filled in), "omit", or "twice".
Step = dict[str, Any] | str
Whole = tuple[int, bytes, dict[str, str]]


class BatchHandler:
    """Answers batch calls: per event, its script's next step, else 200 (applied once)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.posts: list[dict[str, Any]] = []
        self.events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.calls: dict[str, list[float]] = defaultdict(list)
        self.applied: dict[str, int] = defaultdict(int)
        self.scripts: dict[str, list[Step]] = {}
        #: A whole answer to give instead (status, body bytes, headers), chosen from the
        #: events of the POST; None: answer per event.
        self.whole: Callable[[list[dict[str, Any]]], Whole | None] = lambda _: None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/handle"

    async def handle(self, request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        self.posts.append({"headers": dict(request.headers), "doc": doc})
        for event in doc["events"]:
            self.events[event["message_id"]].append(event)
            self.calls[event["message_id"]].append(time.monotonic())
        whole = self.whole(doc["events"])
        if whole is not None:
            status, body, headers = whole
            return web.Response(status=status, body=body, headers=headers)
        results: list[dict[str, Any]] = []
        for event in doc["events"]:
            mid = event["message_id"]
            script = self.scripts.get(mid)
            step: Step = script.pop(0) if script else {"status": 200}
            if step == "omit":
                continue
            if step == "twice":
                results += [{"id": mid, "status": 200}, {"id": mid, "status": 200}]
                continue
            assert isinstance(step, dict)
            result = {"id": mid, **step}
            if result["status"] == 200:
                if self.applied[mid]:
                    result["status"] = 409
                else:
                    self.applied[mid] += 1
            results.append(result)
        return web.json_response({"ferry_batch": 1, "results": results})


@pytest.fixture
async def batch_handler() -> AsyncIterator[BatchHandler]:
    scripted = BatchHandler()
    async with serving(scripted.handle, scripted.port):
        yield scripted


async def _world(env: Env, nc: NATS, url: str, batch: int = 10, **overrides: Any) -> None:
    fast_durable(env, url, **overrides)
    env.doc["durables"]["sea__from_vibespro"]["handler"]["batch"] = batch
    env.write()
    await provision(nc.jetstream(), env.topology, caps=CAPS)


def _ids(n: int) -> list[Any]:
    return [envelope(vibe_id=f"v{i}") for i in range(n)]


async def test_a_batch_durable_applies_every_event_once_in_fewer_posts(
    env: Env, nc: NATS, batch_handler: BatchHandler
) -> None:
    await _world(env, nc, batch_handler.url, batch=10)
    events = _ids(40)
    for event in events:
        await publish(nc, event)
    async with RunningConsumer(env, nc, batch_handler.url) as consumer:
        await until_all(env, [e.message_id for e in events])
    # Exactly once, counted at the handler: every event applied once, none twice.
    assert {e.message_id for e in events} == set(batch_handler.applied)
    assert all(count == 1 for count in batch_handler.applied.values())
    posts = batch_handler.posts
    assert len(posts) < len(events), f"{len(posts)} POSTs for {len(events)} events"
    assert all(len(p["doc"]["events"]) <= 10 for p in posts)
    assert max(len(p["doc"]["events"]) for p in posts) > 1
    for post in posts:  # the wire format: version, count header, no idempotency key
        assert post["doc"]["ferry_batch"] == 1
        assert post["headers"][BATCH_HEADER] == str(len(post["doc"]["events"]))
        assert "Idempotency-Key" not in post["headers"]
    # Each event is exactly the per-message body.
    sent = batch_handler.events[events[0].message_id][0]
    expected = request_body(
        events[0],
        attempt=1,
        max_attempts=4,
        stream_sequence=sent["delivery"]["stream_sequence"],
        durable="sea__from_vibespro",
    )
    assert json.loads(json.dumps(expected, default=str)) == sent
    assert consumer.stats.handler_calls == len(posts)
    samples = consumer.metrics.role.registry.get_sample_value(
        "ferry_handler_batch_size_count", {"durable": "sea__from_vibespro"}
    )
    assert samples == len(posts)


async def test_each_result_is_settled_by_the_ack_table(
    env: Env, nc: NATS, batch_handler: BatchHandler
) -> None:
    await _world(env, nc, batch_handler.url, batch=10)
    ok, dup, rejected, later, final, forgotten, doubled = _ids(7)
    scripts: dict[str, list[Step]] = {
        dup.message_id: [{"status": 409}],
        rejected.message_id: [{"status": 422, "error": {"reason_code": "NO", "error": "never"}}],
        later.message_id: [{"status": 503, "retry_after": 1, "retryable": True}],
        final.message_id: [{"status": 503, "retryable": False, "error": "account closed"}],
        forgotten.message_id: ["omit"],
        doubled.message_id: ["twice"],
    }
    batch_handler.scripts.update(scripts)
    everything = [ok, dup, rejected, later, final, forgotten, doubled]
    for event in everything:
        await publish(nc, event)
    async with RunningConsumer(env, nc, batch_handler.url) as consumer:
        done = [ok, dup, later, forgotten, doubled]
        await until_all(env, [e.message_id for e in done])
        await until_all(env, [rejected.message_id, final.message_id], "failed")
    calls = batch_handler.calls
    # 200 and 409: acked after one call (409: applied before, by the handler's own count).
    assert len(calls[ok.message_id]) == 1 and batch_handler.applied[ok.message_id] == 1
    assert len(calls[dup.message_id]) == 1 and batch_handler.applied[dup.message_id] == 0
    # 503 with retry_after 1: retried no sooner than 1 s (the ladder says 0.2 s).
    first, second = calls[later.message_id]
    assert second - first >= 0.9
    assert batch_handler.applied[later.message_id] == 1
    # A missing and a doubled result: retried, never acked on a guess, applied once.
    assert len(calls[forgotten.message_id]) == 2
    assert len(calls[doubled.message_id]) == 2
    assert batch_handler.applied[forgotten.message_id] == 1
    assert batch_handler.applied[doubled.message_id] == 1
    # 422 and retryable: false: dead-lettered on their first delivery.
    assert len(calls[rejected.message_id]) == 1 and len(calls[final.message_id]) == 1
    records = {r["message_id"]: r for r in await dead_letters(nc)}
    assert records[rejected.message_id]["reasonCode"] == "HANDLER_REJECTED"
    assert "never" in records[rejected.message_id]["lastError"]
    assert records[final.message_id]["reasonCode"] == "HANDLER_NOT_RETRYABLE"
    assert "account closed" in records[final.message_id]["lastError"]
    registry = consumer.metrics.role.registry
    for problem in ("missing", "duplicated"):
        labels = {"durable": "sea__from_vibespro", "problem": problem}
        assert registry.get_sample_value("ferry_handler_batch_problems_total", labels) == 1
    row = await inbox_row(env, forgotten.message_id)
    assert row is not None
    assert json.loads(row["retry_history"])[0]["reason"] == "handler_no_batch_result"


async def test_whole_batch_answers_apply_to_every_event(
    env: Env, nc: NATS, batch_handler: BatchHandler
) -> None:
    await _world(env, nc, batch_handler.url, batch=10)
    events = _ids(5)
    by_attempt: dict[int, Whole] = {
        1: (503, b'{"error": "busy"}', {"Retry-After": "1"}),
        2: (200, b"<html>not a batch answer</html>", {}),
        3: (200, b'{"ferry_batch": 1, "results": [{"id": "nope", "status": 200}]}', {}),
    }
    batch_handler.whole = lambda sent: by_attempt.get(sent[0]["delivery"]["attempt"])
    for event in events:
        await publish(nc, event)
    async with RunningConsumer(env, nc, batch_handler.url) as consumer:
        await until_all(env, [e.message_id for e in events])
    # Three whole answers retried every event, a malformed 200 included; nothing lost,
    # nothing applied twice.
    assert all(len(batch_handler.calls[e.message_id]) == 4 for e in events)
    assert all(batch_handler.applied[e.message_id] == 1 for e in events)
    registry = consumer.metrics.role.registry
    labels = {"durable": "sea__from_vibespro", "problem": "malformed"}
    assert registry.get_sample_value("ferry_handler_batch_problems_total", labels) == 2 * 5
    first, second = (batch_handler.calls[events[0].message_id][i] for i in (0, 1))
    assert second - first >= 0.9, "the whole answer's Retry-After applies to every event"


async def test_an_always_malformed_answer_ends_in_dead_letters_not_acks(
    env: Env, nc: NATS, batch_handler: BatchHandler
) -> None:
    await _world(env, nc, batch_handler.url, batch=10)
    events = _ids(3)
    batch_handler.whole = lambda _: (200, b'{"results": "everything is fine"}', {})
    dsns = {env.topology.contexts[c].database: env.dsn(c) for c in ("sea", "vibespro")}
    for event in events:
        await publish(nc, event)
    async with (
        RunningConsumer(env, nc, batch_handler.url) as consumer,
        RunningRouter(env.topology, dsns, nc.jetstream()),
    ):
        await until_all(env, [e.message_id for e in events], "failed")
    assert not batch_handler.applied
    records = await dead_letters(nc)
    assert {r["message_id"] for r in records} == {e.message_id for e in events}
    for record in records:
        assert record["reasonCode"] == "MAX_DELIVERIES_EXCEEDED"
        assert record["attempts"] == 4
        assert all(h["reason"] == "handler_bad_batch_answer" for h in record["retryHistory"])
    assert consumer.stats.exhausted == 3


async def test_large_events_are_split_so_no_call_exceeds_the_handlers_body_limit(
    env: Env, nc: NATS, batch_handler: BatchHandler
) -> None:
    # Each event is within every per-message limit, a call of all would not be: it would
    # be answered 413 (aiohttp's 1 MiB body limit) and every event of it dead-lettered
    # HANDLER_BAD_REQUEST.
    await _world(env, nc, batch_handler.url, batch=10)
    events = [envelope(vibe_id=f"big{i}", title="Ж" * 490_000) for i in range(2)]
    events += [envelope(vibe_id=f"mid{i}", title="x" * 20_000) for i in range(6)]
    for event in events:
        await publish(nc, event)
    async with RunningConsumer(env, nc, batch_handler.url):
        await until_all(env, [e.message_id for e in events])
    assert all(batch_handler.applied[e.message_id] == 1 for e in events)
    big = {e.message_id for e in events[:2]}
    for post in batch_handler.posts:
        wire = json.dumps(post["doc"], ensure_ascii=False, separators=(",", ":"))
        assert len(wire.encode()) <= 1024 * 1024
        assert len(big & {ev["message_id"] for ev in post["doc"]["events"]}) <= 1
    assert max(len(post["doc"]["events"]) for post in batch_handler.posts) > 1
