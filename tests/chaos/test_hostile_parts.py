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

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chaos.hostile_handler import Decider, make_app, read_log
from chaos.hostile_payloads import LIMITS, WIDE_CHARS, catalogue, size_cases, train
from chaos.roles import Exit, Role
from chaos.scenario_faults import exit_causes

UPSTREAM_BODY = {"status": "processed", "detail": "Ж applied"}


class Upstream:
    """A stand-in for the real handler: answers 200 with a fixed body, counts calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
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
