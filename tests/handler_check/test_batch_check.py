"""``ferry handler-check --batch``: Ferry's example handler (the SDK) answers batch calls
per event and conforms; a handler that knows only per-message calls is reported."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from shared.ops.handler_check import run_batch_checks
from shared.ops.handler_check_batch import BatchProbe, judge_batch
from shared.ops.handler_check_calls import plan_for
from shared.ops.handler_check_send import EffectProbe
from tests.conftest import Env

from .conftest import DURABLE, EFFECT_SQL, SECRET, hand_made
from .test_conformance import SEA_EFFECT_SQL, example_handler, ferry_check

pytestmark = pytest.mark.integration


async def test_ferrys_example_handler_conforms_to_the_batch_checks(world: Env) -> None:
    async with example_handler(world) as url:
        code, doc = await ferry_check(world, url, "--batch", "--effect-sql", SEA_EFFECT_SQL)
    assert code == 0, json.dumps(doc, indent=2)
    batch = {r["check"]: r for r in doc["results"] if r["event"] == "batch"}
    assert set(batch) == {"batch-unsigned", "batch", "batch-duplicate"}
    assert all(r["verdict"] == "conforms" for r in batch.values())
    assert batch["batch-unsigned"]["answer"] == "401"
    assert batch["batch"]["effect_changed"] is True
    assert batch["batch-duplicate"]["effect_changed"] is False
    # Per event: both versions applied, then 409; the poison 422 both times.
    assert batch["batch"]["detail"].count(": 200") == 2
    assert batch["batch-duplicate"]["detail"].count(": 409") == 2
    assert batch["batch-duplicate"]["detail"].count(": 422") == 1


async def test_a_per_message_only_handler_breaches_the_batch_checks(world: Env) -> None:
    plan = plan_for(world.topology, DURABLE)
    conn = await asyncpg.connect(world.dsn("sea"))
    try:
        async with hand_made(world) as url:
            results = await run_batch_checks(
                plan, url, SECRET.encode(), timeout=5, effects=EffectProbe(conn, EFFECT_SQL)
            )
    finally:
        await conn.close()
    verdicts = {r.check: r.verdict for r in results}
    assert verdicts["batch-unsigned"] == "conforms"
    assert verdicts["batch"] == "breach" and verdicts["batch-duplicate"] == "breach"


def _probe() -> BatchProbe:
    body = {"message_id": str(uuid.uuid4()), "delivery": {"attempt": 1}}
    poison = {"message_id": str(uuid.uuid4()), "delivery": {"attempt": 1}}
    return BatchProbe([("vibe_created.v1", body, False), ("poison", poison, True)])


def _answer(probe: BatchProbe, *statuses: int) -> bytes:
    ids = [body["message_id"] for _, body, _ in probe.events]
    results = [{"id": mid, "status": st} for mid, st in zip(ids, statuses, strict=False)]
    return json.dumps({"ferry_batch": 1, "results": results}).encode()


def test_the_batch_judge() -> None:
    probe = _probe()
    assert judge_batch("batch", probe, 200, _answer(probe, 200, 422), True)[0] == "conforms"
    assert judge_batch("batch", probe, 200, _answer(probe, 200, 200), True)[0] == "breach"
    assert judge_batch("batch", probe, 200, _answer(probe, 200), True)[0] == "breach"
    assert judge_batch("batch", probe, 200, b"[]", True)[0] == "breach"
    assert judge_batch("batch", probe, 500, b"", None)[0] == "breach"
    assert judge_batch("batch", probe, 200, _answer(probe, 200, 422), False)[0] == "breach"
    again = "batch-duplicate"
    assert judge_batch(again, probe, 200, _answer(probe, 409, 422), False)[0] == "conforms"
    assert judge_batch(again, probe, 200, _answer(probe, 200, 422), True)[0] == "breach"
    assert judge_batch(again, probe, 200, _answer(probe, 200, 422), None)[0] == "unverified"
    assert judge_batch("batch-unsigned", probe, 401, b"", None)[0] == "conforms"
    assert judge_batch("batch-unsigned", probe, 200, b"", None)[0] == "breach"
