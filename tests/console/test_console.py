"""The console over HTTP against the real stack: sign-in, roles, CSRF, bad input in words,
actions audited through the CLI's tables, no secret in any page."""

from __future__ import annotations

import html
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.helpers import eventually

from .conftest import DURABLE, OTHER, PASSWORDS, TOKEN, Stack, dead_letter_statuses

pytestmark = pytest.mark.integration


async def _session(stack: Stack, user: str) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.post(
        f"{stack.url}/login", data={"user": user, "password": PASSWORDS[user], "next": "/"}
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert f"{user} (" in await resp.text()
    return session


async def _get(session: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, str]:
    async with session.get(url, allow_redirects=False, **kw) as resp:
        return resp.status, html.unescape(await resp.text())


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF token in the page"
    return found.group(1)


def _clean(page: str) -> None:
    """No stack trace, no password hash, no token, no password in a page."""
    for secret in ("Traceback", "scrypt$", TOKEN, *PASSWORDS.values(), "passfile"):
        assert secret not in page, f"{secret!r} rendered"


async def _past(moment: datetime) -> bool:
    return datetime.now(UTC) > moment


async def test_sign_in_roles_csrf_bad_input_and_audit(stack: Stack) -> None:
    url = stack.url
    async with aiohttp.ClientSession() as anonymous:
        status, _ = await _get(anonymous, f"{url}/failures")
        assert status == 303  # to the sign-in page
        async with anonymous.post(
            f"{url}/login", data={"user": "ops", "password": "wrong", "next": "/"}
        ) as resp:
            assert resp.status == 401
            assert "Wrong name or password" in await resp.text()
        async with anonymous.post(f"{url}/failures/action", data={"action": "replay"}) as resp:
            assert resp.status == 401
        # The deployment's bearer token reads (read-only by default).
        status, page = await _get(
            anonymous, f"{url}/", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200 and "token (read-only)" in page
        status, _ = await _get(anonymous, f"{url}/", headers={"Authorization": "Bearer nope"})
        assert status == 303

    ops = await _session(stack, "ops")
    viewer = await _session(stack, "viewer")
    try:
        status, page = await _get(ops, f"{url}/")
        assert status == 200, page
        assert "HANDLER_REJECTED 7" in page, page
        _clean(page)

        # The dead-lettered inbox rows are shown apart from what waits for the consumer.
        async def nothing_waits() -> bool:
            _, page = await _get(ops, f"{url}/")
            return f'id="waiting-{DURABLE}">0<' in page

        await eventually(nothing_waits, timeout=10, what="nothing waiting", interval=0.3)
        _, page = await _get(ops, f"{url}/")
        assert f'id="dead-lettered-{DURABLE}">7<' in page
        # Liveness per role: the running consumer is alive; the durable whose consumer does
        # not answer its /healthz is marked down at once (no lag alert needed).
        assert f'<tr id="role-inbox-consumer-{DURABLE}" class="">' in page, page[:3000]
        assert f'<tr id="role-inbox-consumer-{OTHER}" class="bad">' in page
        assert f'id="liveness-{DURABLE}"' in page and ">consumer alive<" in page
        assert f'<tr id="durable-{OTHER}" class="bad">' in page
        assert f'id="liveness-{OTHER}">consumer down: inbox-consumer-{OTHER} unreachable' in page

        # Bad input: a clear message in the page, never a stack trace.
        for path, code, words in (
            ("/failures?durable=nope", 400, "no durable 'nope'"),
            ("/failures?status=bogus", 400, "unknown status 'bogus'"),
            ("/event/not-a-uuid", 400, "is not a message id"),
            (f"/failures/entry/{DURABLE}/{uuid.uuid4()}", 404, "no dead letter"),
            ("/failures/group?durable=sea__from_vibespro", 400, "a group is named by"),
            ("/jobs/12345", 404, "no such replay job"),
            ("/jobs/abc", 404, "no such replay job"),
            ("/kpi/file/..%2F..%2Fetc/passwd", 404, ""),
        ):
            status, page = await _get(ops, url + path)
            assert status == code, (path, status, page[-500:])
            assert words in page, (path, page[-800:])
            _clean(page)
        # A long input is repeated capped, not in full (a 5,000-character line).
        status, page = await _get(ops, f"{url}/failures?durable={'x' * 5000}")
        assert status == 400 and "x" * 201 not in page, page[-800:]
        assert "… (5,002 characters)" in page  # the name in its quotes
        status, page = await _get(ops, f"{url}/event?q=%25%25")
        assert status == 200 and "search for a message or correlation id" in page
        # Search: a correlation id lists its events; one match opens the event itself.
        _, page = await _get(ops, f"{url}/event?q={stack.correlation}")
        assert sorted(re.findall(r'<a href="/event/([0-9a-f-]{36})">', page)) == sorted(stack.fine)
        conn = await asyncpg.connect(stack.env.dsn("vibespro"))
        try:
            aggregate = await conn.fetchval(
                "SELECT aggregate_id FROM outbox_events WHERE id = $1", uuid.UUID(stack.fine[0])
            )
        finally:
            await conn.close()
        async with ops.get(f"{url}/event?q=vibe/{aggregate}", allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == f"/event/{stack.fine[0]}"
        status, page = await _get(ops, f"{url}/event/{uuid.uuid4()}")
        assert status == 200 and "Not found in any outbox" in page

        # A form without the session's CSRF token is refused, whatever the role.
        target = stack.poison[0]
        form = {"action": "park", "scope": "entry", "durable": DURABLE,
                "message_id": target, "reason": "stop it", "confirm": "1"}  # fmt: skip
        async with ops.post(f"{url}/failures/action", data=form) as resp:
            assert resp.status == 403
            assert "CSRF check failed" in await resp.text()
        async with ops.post(f"{url}/failures/action", data={**form, "csrf": "forged"}) as resp:
            assert resp.status == 403

        # The read-only role cannot act, even with its own valid token; it may dry-run.
        _, page = await _get(viewer, f"{url}/failures/entry/{DURABLE}/{target}")
        assert "Read-only" in page and 'name="confirm"' not in page
        assert 'name="dry_run"' in page and 'id="action-entry"' in page
        async with viewer.post(
            f"{url}/failures/action", data={**form, "csrf": _csrf(page)}
        ) as resp:
            assert resp.status == 403
            assert "viewer is read-only" in html.unescape(await resp.text())
        assert (await dead_letter_statuses(stack.env))[target] == "held"
        # Each durable's hop names where the event is, as `ferry where` does.
        _, page = await _get(ops, f"{url}/event/{target}")
        held = "DEAD-LETTERED (held: held for an operator)"
        assert f'class="place place-dead-lettered">{held}' in page
        _, page = await _get(ops, f"{url}/event/{stack.fine[0]}")
        assert 'class="place place-processed">PROCESSED<' in page
        # Its trace step links to the tracing UI (FERRY_TRACE_URL) with its trace id.
        trace = re.search(r'id="trace-id">([0-9a-f]{32})<', page)
        assert trace, page[-2000:]
        link = f"http://traces.example/ui/trace/{trace.group(1)}?from=console"
        assert f'href="{link}"' in page

        # An entry replayed: "replayed on …" shown once (a reload does not repeat it);
        # once replayed (final), its page offers no action at all.
        fixed = stack.fixable[0]
        entry_url = f"{url}/failures/entry/{DURABLE}/{fixed}"
        _, page = await _get(ops, entry_url)
        assert '<option value="replay">' in page
        await eventually(
            lambda: _past(stack.fixed_at), timeout=10, what="the handler fixed", interval=0.2
        )
        replay = {"action": "replay", "scope": "entry", "durable": DURABLE, "message_id": fixed,
                  "reason": "fixed", "confirm": "1", "csrf": _csrf(page)}  # fmt: skip
        async with ops.post(f"{url}/failures/action", data=replay) as resp:
            text = html.unescape(await resp.text())
            assert resp.status == 200 and "?" not in str(resp.url), resp.url
            assert 'id="done">replayed on ' in text, text[-800:]
        _, page = await _get(ops, entry_url)
        assert 'id="done"' not in page

        async def replayed() -> bool:
            return (await dead_letter_statuses(stack.env))[fixed] == "replayed"

        await eventually(replayed, timeout=20, what="the entry replayed", interval=0.3)
        _, page = await _get(ops, entry_url)
        assert 'id="no-action"' in page and "<option" not in page, page[-1500:]

        # An operator's park goes through the CLI's function: audited with who and why.
        _, page = await _get(ops, f"{url}/failures/entry/{DURABLE}/{target}")
        async with ops.post(f"{url}/failures/action", data={**form, "csrf": _csrf(page)}) as resp:
            assert resp.status == 200, await resp.text()
            assert "1 done, 0 refused" in await resp.text()
        assert (await dead_letter_statuses(stack.env))[target] == "parked"
        conn = await asyncpg.connect(stack.env.dsn("sea"))
        try:
            audit = await conn.fetch(
                "SELECT action, actor, reason FROM dead_letter_actions WHERE message_id = $1",
                uuid.UUID(target),
            )
        finally:
            await conn.close()
        assert [tuple(r) for r in audit] == [("park", "ops@console", "stop it")]

        # Parking it again is refused in words (it is parked already).
        async with ops.post(f"{url}/failures/action", data={**form, "csrf": _csrf(page)}) as resp:
            text = await resp.text()
            assert "0 done, 1 refused" in text and "refused: it is parked" in text
        # An action without a reason is refused before anything changes.
        async with ops.post(
            f"{url}/failures/action",
            data={**form, "action": "discard", "reason": " ", "csrf": _csrf(page)},
        ) as resp:
            assert resp.status == 400
            assert "give a reason to discard" in await resp.text()
        # A dry run changes nothing, for a read-only user too.
        async with viewer.post(
            f"{url}/failures/action",
            data={**form, "action": "discard", "dry_run": "1", "csrf": _csrf(page)},
        ) as resp:
            # the viewer's CSRF token is not the operator's
            assert resp.status == 403
        _, vpage = await _get(viewer, f"{url}/failures")
        async with viewer.post(
            f"{url}/failures/action",
            data={**form, "action": "discard", "dry_run": "1", "csrf": _csrf(vpage)},
        ) as resp:
            text = await resp.text()
            assert resp.status == 200 and "of 1 would be discarded" in text, text[-600:]
            assert "Nothing has changed" in text
        assert (await dead_letter_statuses(stack.env))[target] == "parked"

        # A paced group replay can be cancelled: it stops after the replay in hand.
        _, groups = await _get(ops, f"{url}/failures")
        found = re.search(r'href="(/failures/group\?[^"]+)"[^>]*>open</a>', groups)
        poison_group = [m for m in re.finditer(r'<tr class="group">(.*?)</tr>', groups, re.S)
                        if "poison" in m.group(1)]  # fmt: skip
        assert found and len(poison_group) == 1
        link = re.search(r'href="(/failures/group\?[^"]+)"', poison_group[0].group(1))
        assert link
        _, page = await _get(ops, url + html.unescape(link.group(1)))
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
        async with ops.post(
            f"{url}/failures/action",
            data={
                **fields,
                "action": "replay",
                "reason": "try once",
                "rate": "0.2",
                "confirm": "1",
            },
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303, await resp.text()
            job_url = url + resp.headers["Location"]
        _, page = await _get(ops, job_url)
        assert "running: " in page and "of 2 handled" in page
        async with ops.post(f"{job_url}/cancel", data={"csrf": _csrf(page)}) as resp:
            assert resp.status == 200

        async def cancelled() -> bool:
            return (
                "cancelled: 1 of 2 handled (1 replayed, 0 refused)" in (await _get(ops, job_url))[1]
            )

        await eventually(cancelled, timeout=10, what="the replay cancelled after one", interval=0.2)
        conn = await asyncpg.connect(stack.env.dsn("sea"))
        try:
            attempts = await conn.fetch(
                "SELECT replay_attempts FROM dead_letters WHERE message_id = ANY($1::uuid[])",
                [uuid.UUID(m) for m in stack.poison],
            )
        finally:
            await conn.close()
        assert sorted(r[0] for r in attempts) == [0, 1]  # one replayed, the other never
    finally:
        await ops.close()
        await viewer.close()
    log = stack.log("console")
    assert "Traceback" not in log, log[-3000:]
    # Event pages read the streams on the console's one connection: none opened and
    # closed per page, so no "nats disconnected" warning either.
    assert "nats disconnected" not in log, log[-3000:]
