"""The replay API's async mode against the real stack (INFRA-005 §1.4): a job is
accepted at once (202, queued), travels through module G's outbox, its publisher, the
MEDIATION_REPLAY_JOBS stream and cg_replay to module G's handler, which replays each dead
letter through ``ferry dlq replay``'s audited path; GET and the console's page show it.
Idempotent by id, conflicts named, bad requests refused in words, a re-run never replays
twice."""

from __future__ import annotations

import asyncio
import html
import re
import signal
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from tests.helpers import eventually

from .conftest import DURABLE, FIXABLE, TOKEN, VIEWER, World, api

pytestmark = pytest.mark.integration


async def _done(world: World, job_id: str, timeout: float = 60) -> dict[str, Any]:
    """The job once it is done (or failed)."""
    last: dict[str, Any] = {}

    async def finished() -> bool:
        nonlocal last
        status, last = await api(world, "GET", f"/api/replay-jobs/{job_id}")
        assert status == 200, last
        return last["state"] in ("done", "failed")

    await eventually(finished, timeout=timeout, what=f"job {job_id} done", interval=0.2)
    return last


async def _wait_fixed(world: World) -> None:
    pause = (world.fixed_at - datetime.now(UTC)).total_seconds() + 0.5
    if pause > 0:
        await asyncio.sleep(pause)


async def _processed(world: World, ids: list[str]) -> bool:
    rows = await world.fetch(
        "SELECT count(*) AS n FROM inbox_messages WHERE durable = $1 AND status = 'processed'"
        " AND message_id = ANY($2::uuid[])",
        DURABLE,
        [uuid.UUID(i) for i in ids],
    )
    return bool(rows[0]["n"] == len(ids))


async def _replay_actions(world: World, message_id: str) -> list[Any]:
    return await world.fetch(
        "SELECT actor, reason FROM dead_letter_actions WHERE durable = $1 AND message_id = $2"
        " AND action = 'replay'",
        DURABLE,
        uuid.UUID(message_id),
    )


NO_GROUP = {"durable": DURABLE, "reason_code": "NOPE", "fingerprint": "0123456789ab"}


async def test_bad_requests_are_refused_in_words(world: World) -> None:
    ids = world.fixable
    ok = {"durable": DURABLE, "message_ids": ids[:1], "reason": "fixed"}
    # Not signed in: 401, as JSON, for reading and for writing.
    for method in ("GET", "POST"):
        status, doc = await api(world, method, "/api/replay-jobs", ok, token=None)
        assert status == 401 and "sign in" in doc["error"], doc
    status, doc = await api(world, "POST", "/api/replay-jobs", ok, token="wrong")
    assert status == 401
    cases: list[tuple[Any, int, str]] = [
        (b"{not json", 400, "not JSON"),
        (b"\xff\xfe", 400, "JSON"),
        ([1, 2], 400, "must be a JSON object"),
        ({"message_ids": ids[:1], "durable": DURABLE}, 400, "reason must be a non-empty"),
        ({**ok, "durable": "cg_nope"}, 422, "unknown durable 'cg_nope'"),
        ({**ok, "message_ids": []}, 400, "message_ids is empty"),
        ({**ok, "message_ids": [str(uuid.uuid4()) for _ in range(101)]}, 422, "too many"),
        ({**ok, "message_ids": ["nope"]}, 400, '"nope" is not a message id'),
        ({**ok, "message_ids": [str(uuid.uuid4())]}, 422, f"no dead letter {DURABLE}/"),
        ({**ok, "colour": "red"}, 400, "unknown field(s): colour"),
        ({"reason": "x"}, 400, "either message_ids"),
        ({**ok, "group": {}}, 400, "either message_ids"),
        ({"reason": "x", "group": NO_GROUP}, 404, "unknown group"),
        ({"reason": "x", "group": {"durable": DURABLE}}, 400, "group.reason_code"),
    ]
    for body, code, words in cases:
        raw = body if isinstance(body, bytes) else None
        status, doc = await api(world, "POST", "/api/replay-jobs", body, raw=raw)
        assert status == code, (body, status, doc)
        assert words in doc["error"], (body, doc)
    status, doc = await api(
        world, "POST", "/api/replay-jobs", ok, headers={"Idempotency-Key": "has space"}
    )
    assert status == 400 and "Idempotency-Key" in doc["error"]
    status, doc = await api(world, "GET", f"/api/replay-jobs/{uuid.uuid4()}")
    assert status == 404 and "no replay job" in doc["error"]
    status, doc = await api(world, "GET", "/api/replay-jobs/not-a-uuid")
    assert status == 404
    # A read-only user may look, never start a job (the session's CSRF token in a header).
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as viewer:
        async with viewer.post(
            f"{world.url}/login", data={"user": VIEWER[0], "password": VIEWER[1], "next": "/"}
        ) as resp:
            page = await resp.text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        status, doc = await api(
            world, "POST", "/api/replay-jobs", ok, token=None, session=viewer,
            headers={"X-CSRF-Token": csrf.group(1)},
        )  # fmt: skip
        assert status == 403 and "read-only" in doc["error"], doc
        status, doc = await api(world, "POST", "/api/replay-jobs", ok, token=None, session=viewer)
        assert status == 403 and "CSRF" in doc["error"], doc
        status, doc = await api(world, "GET", "/api/replay-jobs", token=None, session=viewer)
        assert status == 200 and doc == {"jobs": []}
    # Nothing was accepted, nothing replayed.
    rows = await world.fetch("SELECT count(*) AS n FROM replay_jobs", context="module_g")
    assert rows[0]["n"] == 0
    rows = await world.fetch("SELECT DISTINCT status FROM dead_letters")
    assert [r["status"] for r in rows] == ["held"]  # replay: operator holds them


async def test_a_job_is_accepted_at_once_then_runs_once_through_the_stream(world: World) -> None:
    await _wait_fixed(world)
    ids = world.fixable
    first = {"durable": DURABLE, "message_ids": ids[:2], "reason": "bug 17 fixed"}
    key = {"Idempotency-Key": "dispute-4711"}
    started = time.monotonic()
    status, job = await api(world, "POST", "/api/replay-jobs", first, headers=key)
    assert status == 202, job
    assert time.monotonic() - started < 5
    # Accepted, not executed: the answer is the row as it was committed.
    assert job["state"] == "queued" and job["results"] == [] and job["total"] == 2
    assert job["actor"] == "token@console"
    job_id = job["job_id"]
    assert job_id == str(uuid.uuid5(uuid.UUID("6f0d3c2e-8a51-4c1b-9a7e-26f3c5e0b1d4"),
                                    "dispute-4711"))  # fmt: skip
    # It travelled: module G's outbox row (the job's id) was published and cg_replay took it.
    done = await _done(world, job_id)
    assert done["state"] == "done", done
    assert (done["replayed"], done["refused"], done["runs"]) == (2, 0, 1), done
    assert {r["outcome"] for r in done["results"]} == {"replayed"}
    rows = await world.fetch(
        "SELECT published_at FROM outbox_events WHERE id = $1",
        uuid.UUID(job_id),
        context="module_g",
    )
    assert rows and rows[0]["published_at"] is not None
    rows = await world.fetch(
        "SELECT status FROM inbox_messages WHERE durable = 'cg_replay' AND message_id = $1",
        uuid.UUID(job_id),
        context="module_g",
    )
    assert [r["status"] for r in rows] == ["processed"]
    # The dead letters were replayed and processed, audited with the job's actor and reason.
    await eventually(lambda: _processed(world, ids[:2]), timeout=30, what="replays processed")
    for message_id in ids[:2]:
        actions = await _replay_actions(world, message_id)
        assert [(a["actor"], a["reason"]) for a in actions] == [
            ("token@console", f"bug 17 fixed (replay job {job_id})")
        ]

    # The same key and request: the same job, answered with its status; nothing runs again.
    status, again = await api(world, "POST", "/api/replay-jobs", first, headers=key)
    assert status == 200 and again["job_id"] == job_id and again["state"] == "done"
    status, again = await api(world, "POST", "/api/replay-jobs", {**first, "job_id": job_id})
    assert status == 200 and again["job_id"] == job_id
    # The same key, another request: 409 naming the conflict.
    other = {**first, "message_ids": ids[2:3]}
    status, conflict = await api(world, "POST", "/api/replay-jobs", other, headers=key)
    assert status == 409, conflict
    assert job_id in conflict["error"] and "another request" in conflict["error"]
    assert conflict["request"]["message_ids"] == sorted(ids[:2])
    await asyncio.sleep(1.0)
    for message_id in ids[:2]:
        assert len(await _replay_actions(world, message_id)) == 1
    rows = await world.fetch("SELECT count(*) AS n FROM replay_jobs", context="module_g")
    assert rows[0]["n"] == 1

    # Entries replayed already: refused, counted, never replayed again.
    async def settled() -> bool:
        rows = await world.fetch(
            "SELECT count(*) AS n FROM dead_letters WHERE status = 'replayed'"
            " AND message_id = ANY($1::uuid[])",
            [uuid.UUID(i) for i in ids[:2]],
        )
        return bool(rows[0]["n"] == 2)

    await eventually(settled, timeout=30, what="the replays settled")
    status, job = await api(world, "POST", "/api/replay-jobs", {**first, "reason": "again?"})
    assert status == 202
    done = await _done(world, job["job_id"])
    assert (done["state"], done["replayed"], done["refused"]) == ("done", 0, 2), done
    assert all("is replayed" in r["reason"] for r in done["results"]), done["results"]
    for message_id in ids[:2]:
        assert len(await _replay_actions(world, message_id)) == 1

    # A failure group (the console's grouping): its open entries, the rest of them.
    rows = await world.fetch(
        "SELECT DISTINCT reason_code, fingerprint AS fp FROM dead_letters WHERE status = 'held'"
    )
    assert len(rows) == 1
    group = {"durable": DURABLE, "reason_code": rows[0]["reason_code"],
             "fingerprint": rows[0]["fp"]}  # fmt: skip
    status, job = await api(world, "POST", "/api/replay-jobs", {"group": group, "reason": "all"})
    assert status == 202 and job["total"] == FIXABLE - 2, job
    assert sorted(e["message_id"] for e in job["entries"]) == sorted(ids[2:])
    done = await _done(world, job["job_id"])
    assert (done["state"], done["replayed"], done["refused"]) == ("done", FIXABLE - 2, 0)
    await eventually(lambda: _processed(world, ids), timeout=30, what="every replay processed")

    # GET lists them; the console's pages show them.
    status, listed = await api(world, "GET", "/api/replay-jobs")
    assert status == 200 and len(listed["jobs"]) == 3
    async with aiohttp.ClientSession() as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with client.get(f"{world.url}/replay-jobs", headers=auth) as resp:
            assert resp.status == 200
            page = html.unescape(await resp.text())
        assert job_id in page and "bug 17 fixed" in page and "Replay jobs" in page
        async with client.get(f"{world.url}/replay-jobs/{job_id}", headers=auth) as resp:
            assert resp.status == 200
            page = html.unescape(await resp.text())
        assert "done: 2 replayed, 0 refused of 2" in page
        for message_id in ids[:2]:
            assert f"{DURABLE}/{message_id}" in page
        assert page.count("outcome-replayed") == 2
        async with client.get(f"{world.url}/replay-jobs/{uuid.uuid4()}", headers=auth) as resp:
            assert resp.status == 404


# Slow on purpose: a replay every 3 s, so the job is cut after its first entry.
@pytest.mark.parametrize("replay_rate", ["0.33"])
async def test_a_run_cut_short_runs_again_and_replays_nothing_twice(world: World) -> None:
    """Module G's handler dies mid-job (SIGKILL after the first replay): the claim rolls
    back, cg_replay redelivers, the new run refuses what the first replayed."""
    await _wait_fixed(world)
    ids = world.fixable[:2]
    status, job = await api(
        world, "POST", "/api/replay-jobs", {"durable": DURABLE, "message_ids": ids, "reason": "r"}
    )
    assert status == 202
    job_id = job["job_id"]

    async def one_replayed() -> bool:
        _, doc = await api(world, "GET", f"/api/replay-jobs/{job_id}")
        return bool(doc["state"] == "running" and doc["replayed"] == 1)

    await eventually(one_replayed, timeout=60, what="the first entry replayed", interval=0.1)
    world.procs["handler-module_g"].send_signal(signal.SIGKILL)
    await asyncio.to_thread(world.procs["handler-module_g"].wait, 20)
    await world.start_g_handler()
    done = await _done(world, job_id, timeout=90)
    assert done["state"] == "done" and done["runs"] == 2, done
    assert (done["replayed"], done["refused"]) == (1, 1), done
    refused = [r for r in done["results"] if r["outcome"] == "refused"]
    assert "replayable from" in refused[0]["reason"]
    await eventually(lambda: _processed(world, ids), timeout=30, what="both processed")
    for message_id in ids:
        assert len(await _replay_actions(world, message_id)) == 1
