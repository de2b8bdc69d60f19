"""Parked keys of an ``ordering: key`` durable in the console: listed with their heads,
and a held head discarded through ``ferry parked discard``'s function, audited."""

from __future__ import annotations

import html
import json
import re
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from devstack.ports import free_port
from services.console.auth import hash_password
from tests.conftest import Env

from .conftest import DURABLE, PASSWORDS, _start, _stop, wait_ready

pytestmark = pytest.mark.integration

_PARK = """
INSERT INTO parked_messages (durable, ordering_key, stream_seq, message_id, delivered_seq,
                             subject, data, state, attempts, reason)
VALUES ($1, $2, $3, $4, $3, 'vibespro.event.vibe_created.v1', '\\x7b7d', $5, $6, $7)
"""


async def test_parked_keys_listed_and_a_held_head_discarded(env: Env, tmp_path: Path) -> None:
    env.doc["durables"][DURABLE]["ordering"] = "key"
    env.write()
    await env.grant_roles()  # the console's login gets the parked tables of ordered durables
    head, behind, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        await conn.execute(_PARK, DURABLE, "vibe/v-1", 10, head, "held", 4, "HANDLER_REJECTED")
        await conn.execute(_PARK, DURABLE, "vibe/v-1", 11, behind, "queued", 0, None)
        await conn.execute(_PARK, DURABLE, "vibe/v-2", 12, other, "retrying", 2, "HTTP_503")
        # As the consumer leaves an event behind a held head: waiting for an operator (0022).
        await conn.execute(
            "UPDATE parked_messages SET next_attempt_at = 'infinity' WHERE message_id = $1", behind
        )
    finally:
        await conn.close()
    accounts = tmp_path / "accounts.json"
    accounts.write_text(
        json.dumps({"ops": {"role": "operator", "password": hash_password(PASSWORDS["ops"])}})
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    proc = _start(
        env, "console", ["services.console"], logs, role=f"console-{env.topology.name}",
        FERRY_CONSOLE_PORT=str(port), FERRY_CONSOLE_ACCOUNTS_FILE=str(accounts),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(f"{url}/readyz", proc, "console")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as ops:
            async with ops.post(
                f"{url}/login", data={"user": "ops", "password": PASSWORDS["ops"]}
            ) as resp:
                assert resp.status == 200
            async with ops.get(f"{url}/failures") as resp:
                page = html.unescape(await resp.text())
            assert "2 key(s), 3 event(s), 1 held for an operator" in page, page[-3000:]
            assert str(head) in page and "held x4" in page and "retrying x2" in page
            csrf = re.search(r'name="csrf" value="([^"]+)"', page)
            assert csrf
            form = {"csrf": csrf.group(1), "durable": DURABLE, "reason": "poison, fixed upstream"}
            # A key whose head is retrying has no held head to discard: refused in words.
            async with ops.post(f"{url}/parked/discard", data={**form, "key": "vibe/v-2"}) as r:
                assert r.status == 409
                assert "has no held head" in html.unescape(await r.text())
            async with ops.post(f"{url}/parked/discard", data={**form, "key": "vibe/v-1"}) as r:
                assert r.status == 200
                assert "1 done, 0 refused" in await r.text()
    finally:
        await _stop(proc)
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        left = {r[0] for r in await conn.fetch("SELECT message_id FROM parked_messages")}
        audit = await conn.fetch("SELECT message_id, actor, reason FROM parked_actions")
        due = await conn.fetchval(
            "SELECT next_attempt_at <= clock_timestamp() FROM parked_messages"
            " WHERE message_id = $1",
            behind,
        )
    finally:
        await conn.close()
    assert left == {behind, other}  # the held head gone; the key's next event goes on
    assert due, "the console's discard made the key's next event due (its login may)"
    assert [tuple(r) for r in audit] == [(head, "ops@console", "poison, fixed upstream")]
