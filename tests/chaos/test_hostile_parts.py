"""The hostile handler and the hostile payload catalogue, on their own (no world).

The hostile handler runs on a real socket in front of a real upstream application that
counts its calls; answers are read with a real aiohttp client, as the consumer reads
them. The catalogue's sized payloads are checked byte for byte.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chaos.engine.roles import Exit, Role, exit_causes
from chaos.scenarios.hostile_handler.front import Decider, make_app, read_log
from chaos.scenarios.hostile_payloads.cases import LIMITS, WIDE_CHARS, catalogue, size_cases, train
from shared.domain.batch_call import (
    BATCH_HEADER,
    batch_answer_document,
    batch_document,
    batch_headers,
    result_entry,
)
from shared.domain.signing import sign

UPSTREAM_BODY = {"status": "processed", "detail": "Ж applied"}


class Upstream:
    """A stand-in for the real handler: answers 200 with a fixed body, counts calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.batch_headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        if BATCH_HEADER in request.headers:
            # A batch call: one result per event, 422 for an event marked ``reject``.
            self.batch_headers.append(dict(request.headers))
            results = []
            for event in doc["events"]:
                self.calls[event["message_id"]] += 1
                status = 422 if event["payload"].get("reject") else 200
                results.append(result_entry(event["message_id"], status))
            return web.json_response(batch_answer_document(results))
        self.calls[doc["message_id"]] += 1
        return web.json_response(UPSTREAM_BODY)


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[tuple[str, Upstream, Path]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/handle", upstream.handle)
    async with TestServer(app) as real:
        log = tmp_path / "hostile.jsonl"
        async with TestServer(make_app(str(real.make_url("/handle")), 5, log)) as front:
            yield str(front.make_url("/handle")), upstream, log


async def _call(session: aiohttp.ClientSession, url: str, message_id: str) -> str:
    """What the consumer would see: ``status:body-ok`` or the client error's name."""
    body = json.dumps({"message_id": message_id, "payload": {}}).encode()
    try:
        async with session.post(url, data=body) as resp:
            raw = await resp.read()
            ok = resp.status != 200 or json.loads(raw) == UPSTREAM_BODY
            return f"{resp.status}:{'body-ok' if ok else 'body-wrong'}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return type(exc).__name__


async def test_every_answer_is_logged_and_only_forwarded_calls_reach_the_handler(
    hostile: tuple[str, Upstream, Path],
) -> None:
    url, upstream, log = hostile
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        seen = [await _call(session, url, f"m-{n}") for n in range(120)]
    answers = read_log(log)
    assert len(answers) == len(seen) == 120
    by_action = Counter(a["action"] for a in answers)
    assert set(by_action) == {"pass", "status", "replaced", "trickle", "reset"}
    # Self-made statuses never reach the real handler; every other action does, once.
    forwarded = [a for a in answers if a["action"] != "status"]
    assert sum(upstream.calls.values()) == len(forwarded)
    for answer, outcome in zip(answers, seen, strict=True):
        if answer["action"] in ("pass", "trickle"):
            assert outcome == "200:body-ok", answer  # trickled, but whole
        elif answer["action"] == "reset":
            assert not outcome[0].isdigit(), answer  # the client saw the connection die
        else:
            assert outcome.startswith(str(answer["status"])), (answer, outcome)


async def test_a_batch_call_is_forwarded_whole_and_logged_once_per_event(
    hostile: tuple[str, Upstream, Path],
) -> None:
    url, upstream, log = hostile
    secret, sent, seen = b"s3cret", [], list[Any]()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for n in range(40):
            events = [
                {"message_id": f"b-{n}-{i}", "payload": {"reject": i == 1}, "traceparent": "t"}
                for i in range(3)
            ]
            data = json.dumps(batch_document(events)).encode()
            headers = {**batch_headers(3), "Content-Type": "application/json"}
            headers |= {"traceparent": f"00-{n:032x}-{n + 1:016x}-01"}
            headers |= sign(secret, "vibespro__from_sea", data, 1.0)
            sent.append(headers)
            try:
                async with session.post(url, data=data, headers=headers) as resp:
                    raw = await resp.read()
                    seen.append(resp.status if resp.status != 200 else json.loads(raw))
            except (aiohttp.ClientError, TimeoutError) as exc:
                seen.append(type(exc).__name__)
    answers = read_log(log)
    assert len(answers) == 3 * 40  # one line per event
    assert {a["batch"] for a in answers} == {3}
    calls = [answers[k : k + 3] for k in range(0, len(answers), 3)]
    for lines, outcome in zip(calls, seen, strict=True):
        assert [a["index"] for a in lines] == [0, 1, 2]
        assert len({a["action"] for a in lines}) == 1  # one action for the whole call
        assert all(a["call"] == 1 for a in lines)
        if lines[0]["action"] == "pass":
            # Each event's own result: the upstream rejected the second one.
            assert [a["status"] for a in lines] == [200, 422, 200]
            assert [r["status"] for r in outcome["results"]] == [200, 422, 200]
        elif lines[0]["action"] != "reset":
            # One status sent for the whole call is every event's outcome.
            assert len({a["status"] for a in lines}) == 1
    actions = Counter(c[0]["action"] for c in calls)
    assert actions["pass"] > 0 and actions["status"] > 0
    # Every forwarded call reached the real handler with the consumer's headers.
    assert len(upstream.batch_headers) == 40 - actions["status"]
    for got in upstream.batch_headers:
        match = [h for h in sent if h["traceparent"] == got["traceparent"]]
        assert len(match) == 1
        for name in (BATCH_HEADER, "Ferry-Signature", "Ferry-Timestamp", "Ferry-Durable"):
            assert got[name] == match[0][name]


def test_a_batch_call_draws_from_its_ids_and_their_call_numbers() -> None:
    first, second = Decider(9), Decider(9)
    rng_a, calls_a = first.rng_for_call(["x", "y", "z"])
    rng_b, calls_b = second.rng_for_call(["z", "x", "y"])  # another order: the same draw
    assert calls_a == calls_b == [1, 1, 1]
    assert rng_a.random() == rng_b.random()
    _, calls_c = first.rng_for_call(["x", "w"])  # x's second call
    assert calls_c == [2, 1]
    assert first.rng_for("y")[1] == 2


def test_the_same_seed_decides_the_same_answers() -> None:
    first, second, other = Decider(9), Decider(9), Decider(10)

    def plan(decider: Decider) -> list[str]:
        return [decider.action(decider.rng_for(f"m-{n % 7}")[0]) for n in range(70)]

    assert plan(first) == plan(second)
    assert plan(first) != plan(other)


def test_sized_payloads_are_exactly_at_and_around_each_limit() -> None:
    cases = size_cases(tuple(WIDE_CHARS))
    for limit_name, limit in LIMITS:
        for width in WIDE_CHARS:
            for offset in (-16, 0, 16):
                case = next(c for c in cases if c.name == f"text{width}B@{limit_name}{offset:+d}")
                assert case.size == limit + offset
                assert WIDE_CHARS[width] * 100 in json.loads(case.payload_text)["name"]
                must = limit + offset <= LIMITS[1][1]  # within the producer's limit
                assert (case.expect == "processed") == must


def test_catalogue_gives_every_case_its_own_aggregate_and_a_train_shares_one() -> None:
    cases = catalogue(rounds=2)
    assert len({c.name for c in cases}) == len(cases)
    assert len({c.aggregate_id for c in cases}) == len(cases)
    head, *followers = train(5)
    assert head.size > LIMITS[2][1] and len(followers) == 5
    assert {c.aggregate_id for c in followers} == {head.aggregate_id}


def test_exit_causes_name_the_exception_of_each_run_that_ended_by_itself(tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    log.write_text(
        "--- start #1 at 1.000\n"
        "Traceback (most recent call last):\n"
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xfa in position 0: bad\n"
        '{"level": "error", "message": "Unclosed client session"}\n'
        "--- start #2 at 2.000\n"
        "ValueError: cannot convert float NaN to integer\n"
        "--- start #3 at 3.000\n"
        '{"level": "info", "message": "stopped"}\n'
    )
    role = Role("consumer-x", "consumer", [], {}, log)
    role.unexpected = [Exit(1.0, role.name, 1, ""), Exit(2.0, role.name, 1, "")]
    assert exit_causes([role]) == Counter(
        {
            "consumer-x: UnicodeDecodeError: 'utf-8' codec can't decode byte N": 1,
            "consumer-x: ValueError: cannot convert float NaN to integer": 1,
        }
    )
