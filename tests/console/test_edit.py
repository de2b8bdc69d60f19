"""Edit-and-retry in the console over HTTP against the real stack: an operator edits a
poison dead letter's payload and it is replayed once, with the edited payload, under its
own id; the schema refuses a bad edit in words; a read-only user sees no form and her
POST is refused; a final dead letter cannot be edited. Counted against the handler's own
tables (its ledger and its effect), not the console's."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest

from tests.helpers import eventually

from .conftest import DURABLE, Stack, dead_letter_statuses
from .test_console import _csrf, _get, _session

pytestmark = pytest.mark.integration


async def _rows(stack: Stack, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(stack.env.dsn("sea"))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _unchanged(stack: Stack, target: str) -> tuple[Any, ...]:
    row = await _rows(stack, "SELECT status, record::text, replay_attempts FROM dead_letters "
                             "WHERE message_id = $1", uuid.UUID(target))  # fmt: skip
    edits = await _rows(stack, "SELECT count(*) FROM dead_letter_edits")
    actions = await _rows(stack, "SELECT count(*) FROM dead_letter_actions")
    return tuple(row[0]), edits[0][0], actions[0][0]


async def test_operator_edits_and_retries_a_viewer_cannot(stack: Stack) -> None:
    url, target = stack.url, stack.poison[0]
    entry = f"{url}/failures/entry/{DURABLE}/{target}"
    ops = await _session(stack, "ops")
    viewer = await _session(stack, "viewer")
    try:
        before = await _unchanged(stack, target)
        # The read-only user: no form; her POST, with her own valid token, is refused.
        _, page = await _get(viewer, entry)
        assert 'id="edit-entry"' not in page and "<textarea" not in page
        form = {"durable": DURABLE, "message_id": target, "reason": "viewer tries",
                "payload": json.dumps({"vibe_id": "x", "title": "viewer"})}  # fmt: skip
        async with viewer.post(f"{url}/failures/edit", data={**form, "csrf": _csrf(page)}) as resp:
            assert resp.status == 403
            assert "viewer is read-only" in await resp.text()
        assert await _unchanged(stack, target) == before

        # The operator: the form holds the payload as it is.
        _, page = await _get(ops, entry)
        assert 'id="edit-entry"' in page and '"poison": true' in page
        sql = (
            "SELECT record #>> '{payload,payload,vibe_id}' FROM dead_letters WHERE message_id = $1"
        )
        vibe_id = (await _rows(stack, sql, uuid.UUID(target)))[0][0]
        # A payload the schema refuses: named, nothing changed.
        bad = {
            **form,
            "csrf": _csrf(page),
            "reason": "fix",
            "payload": json.dumps({"vibe_id": vibe_id}),
        }
        async with ops.post(f"{url}/failures/edit", data=bad) as resp:
            text = await resp.text()
            assert resp.status == 422, text[-800:]
            assert "payload.title: required property is missing" in text
        async with ops.post(f"{url}/failures/edit", data={**bad, "payload": "{nope"}) as resp:
            assert resp.status == 422 and "is not JSON" in await resp.text()
        assert await _unchanged(stack, target) == before

        # The fix: no poison directive, a new title. Replayed, shown once on the page.
        fixed = {"vibe_id": vibe_id, "title": "edited by ops"}
        good = {**bad, "payload": json.dumps(fixed), "reason": "producer sent a test flag"}
        async with ops.post(f"{url}/failures/edit", data=good) as resp:
            text = await resp.text()
            assert resp.status == 200 and str(resp.url).endswith(target), text[-800:]
            assert "edited (payload._ferry_test, payload.title) and replayed on" in text

        async def replayed() -> bool:
            return (await dead_letter_statuses(stack.env))[target] == "replayed"

        await eventually(replayed, timeout=30, what="the edited replay processed", interval=0.3)
        # The handler's own records: one successful call for the id, its effect the edit's.
        calls = await _rows(stack, "SELECT status FROM handler_calls WHERE message_id = $1",
                            uuid.UUID(target))  # fmt: skip
        assert sorted(r[0] for r in calls if r[0] == 200) == [200], calls
        [effect] = await _rows(stack, "SELECT title FROM handler_sea_vibes WHERE vibe_id = $1",
                               vibe_id)  # fmt: skip
        assert effect[0] == "edited by ops"
        [edit] = await _rows(stack, "SELECT original_payload, edited_payload, actor, reason "
                                    "FROM dead_letter_edits WHERE message_id = $1",
                             uuid.UUID(target))  # fmt: skip
        assert json.loads(edit["original_payload"])["_ferry_test"] == {"poison": True}
        assert json.loads(edit["edited_payload"]) == fixed
        assert (edit["actor"], edit["reason"]) == ("ops@console", "producer sent a test flag")

        # Final now: no form, and a POST is refused; the page and the journey show the edit.
        _, page = await _get(ops, entry)
        assert 'id="edit-entry"' not in page and 'id="edits"' in page
        assert "edited payload._ferry_test, payload.title" in page
        async with ops.post(f"{url}/failures/edit", data={**good, "csrf": _csrf(page)}) as resp:
            assert resp.status == 409 and "is replayed" in await resp.text()
        _, journey = await _get(ops, f"{url}/event/{target}")
        assert "edit by ops@console" in journey
        assert "(edited payload._ferry_test, payload.title)" in journey
        assert len(await _rows(stack, "SELECT 1 FROM dead_letter_edits")) == 1
    finally:
        await ops.close()
        await viewer.close()
    assert "Traceback" not in stack.log("console")
