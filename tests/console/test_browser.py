"""The console in a real browser (Debian's chromium, driven by Playwright) against the real
stack with dead letters: sign in, read the overview, open a failure group, dry-run and
replay it, watch its entries become replayed, offer no action on what was replayed, find
an event by id and open its journey and trace, and check the read-only role can only
dry-run.

Screenshots of each page go to ``.var/screenshots/`` (git ignores ``.var/``; CI keeps
them as artifacts). No Playwright browser is downloaded: chromium is Debian's
(``./dev setup`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from playwright.async_api import Browser, Page, async_playwright

from .conftest import DURABLE, PASSWORDS, SCREENSHOTS, Stack, dead_letter_statuses, record

pytestmark = pytest.mark.integration
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


HAVE_CHROMIUM = CHROMIUM.exists()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not HAVE_CHROMIUM:
        pytest.fail("Debian's chromium is missing (./dev setup installs it)")
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


async def _shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


async def _sign_in(page: Page, stack: Stack, user: str) -> None:
    await page.goto(f"{stack.url}/")
    assert "/login" in page.url
    await page.fill("input[name=user]", user)
    await page.fill("input[name=password]", PASSWORDS[user])
    await page.click("form.login button[type=submit]")
    await page.wait_for_selector("#whoami")


async def test_operator_replays_a_failure_group_and_follows_an_event(
    stack: Stack, browser: Browser
) -> None:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # Sign in (a wrong password first).
    await page.goto(f"{stack.url}/failures")
    assert "/login" in page.url
    await page.fill("input[name=user]", "ops")
    await page.fill("input[name=password]", "not the password")
    await page.click("form.login button[type=submit]")
    assert "Wrong name or password" in await page.inner_text("#login-error")
    await _shot(page, "01-sign-in-refused")
    await _sign_in(page, stack, "ops")
    assert "ops (operator)" in await page.inner_text("#whoami")

    # Overview: the durable, its dead letters by reason, sparklines with thresholds.
    await page.goto(f"{stack.url}/")
    row = page.locator(f"#durable-{DURABLE}")
    assert "HANDLER_REJECTED 7" in await row.inner_text()
    assert await page.locator("#outboxes tbody tr").count() == 2
    assert await page.locator("#durables svg.spark line.threshold").count() >= 2
    await _shot(page, "02-overview")

    # Failures: two groups of the one reason (two different errors); open the fixable one.
    await page.click("header nav >> text=Failures")
    groups = page.locator("#groups tr.group")
    assert await groups.count() == 2
    fixable = groups.filter(has_text="reject_until")
    assert "5" in await fixable.locator("td.n").inner_text()
    await _shot(page, "03-failures")
    await fixable.locator("a.open-group").click()
    assert await page.locator("#entries tr.entry").count() == 5
    await _shot(page, "04-failure-group")

    # Dry run: exactly what would happen, nothing changed.
    remaining = (stack.fixed_at - datetime.now(UTC)).total_seconds()
    if remaining > 0:  # the "fix" of the handler must be live before the replay
        await asyncio.sleep(remaining + 0.5)
    form = page.locator("#action-group")
    await form.locator("select[name=action]").select_option("replay")
    await form.locator("input[name=reason]").fill("handler fixed in 1.4.2")
    await form.locator("input[name=rate]").fill("20")
    await form.locator("button[name=dry_run]").click()
    summary = await page.inner_text("#dry-run-summary")
    assert "5 of 5 would be replayed" in summary and "Nothing has changed" in summary
    assert await page.locator("#plan tbody tr").count() == 5
    await _shot(page, "05-dry-run")
    statuses = await dead_letter_statuses(stack.env)
    assert [statuses[m] for m in stack.fixable] == ["held"] * 5

    # Replay the group: a job with its progress; the entries become replayed.
    await page.click("#confirm button[name=confirm]")
    assert "/jobs/" in page.url
    # The job page updates itself in place (static/live.js): no reload, no navigation.
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    deadline = time.monotonic() + 60
    while True:
        text = await page.inner_text("#job-entries")
        if text.count("replayed") >= 5 and "replaying" not in text:
            break
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.5)
    assert navigations == []
    updates = await page.evaluate("document.documentElement.getAttribute('data-live-updates')")
    assert int(updates) >= 1, "the entries must have changed through a live update"
    assert "done: 5 of 5 handled (5 replayed, 0 refused)" in await page.inner_text("#job-state")
    await _shot(page, "06-replay-done")
    statuses = await dead_letter_statuses(stack.env)
    assert [statuses[m] for m in stack.fixable] == ["replayed"] * 5

    # What was replayed is final: its page offers no action to be refused after the click.
    await page.goto(f"{stack.url}/failures/entry/{DURABLE}/{stack.fixable[0]}")
    assert await page.inner_text("#fact-status") == "replayed"
    assert await page.locator("#action-entry").count() == 0
    assert "Nothing to do: it is replayed (final)" in await page.inner_text("#no-action")
    await _shot(page, "07-replayed-final")

    # Find the event by id: its journey across the hops, its trace.
    await page.click("header nav >> text=Event")
    await page.fill("#search input[name=q]", stack.fixable[0])
    await page.click("#search button")
    assert f"/event/{stack.fixable[0]}" in page.url
    journey = await page.inner_text("#journey")
    assert "published" in journey and "processed" in journey
    assert "replayed" in journey and "replay by ops@console" in journey, journey
    trace_id = await page.inner_text("#trace-id")
    link = await page.get_attribute("#trace-link", "href") or ""
    assert link == f"http://traces.example/ui/trace/{trace_id}?from=console", link
    deadline = time.monotonic() + 20
    while await page.locator("#timeline tr.span").count() < 2:  # spans flushed in batches
        assert time.monotonic() < deadline, "no trace timeline"
        await asyncio.sleep(1.0)
        await page.reload()
    assert "ferry where" in await page.inner_text("main")
    await _shot(page, "08-event-journey")

    # Search by aggregate and by subject list events; a nonsense query is explained.
    await page.goto(f"{stack.url}/event?q=vibespro.event.vibe_created.v1")
    assert await page.locator("#results tbody tr").count() == 15
    await page.goto(f"{stack.url}/event?q=hello")
    assert "search for a message or correlation id" in await page.inner_text("#search-error")

    # KPI: the latest report's verdict, findings and plots; the runs table.
    await page.click("header nav >> text=KPI")
    assert await page.inner_text("#kpi-verdict") == "alert"
    assert "dlq_spike" in await page.inner_text("main")
    for plot in ("latency.png", "windows.png"):
        image = page.locator(f"img[alt='{plot}']")
        assert await image.evaluate("i => i.complete && i.naturalWidth > 100"), plot
    assert "alert" in await page.inner_text("#kpi-runs")
    await _shot(page, "09-kpi")
    assert not errors, errors

    # The overview again: the sparklines have the samples of the run, the replayed
    # group is no longer open.
    await page.goto(f"{stack.url}/")
    assert "HANDLER_REJECTED 2" in await page.locator(f"#durable-{DURABLE}").inner_text()
    assert await page.locator("#durables svg.spark polyline").count() >= 3
    await _shot(page, "11-overview-after-replay")

    # The read-only role reads everything and can act on nothing.
    await page.click("header form.who button")
    await _sign_in(page, stack, "viewer")
    await page.goto(f"{stack.url}/failures")
    await page.locator("#groups tr.group").filter(has_text="poison").locator("a.open-group").click()
    # A dry run only: the form has no button that acts.
    assert await page.locator("form.action button[name=confirm]").count() == 0
    assert await page.locator("#action-group button[name=dry_run]").count() == 1
    assert "Read-only" in await page.inner_text("main")
    await _shot(page, "10-read-only-group")
    csrf = await page.get_attribute("header form.who input[name=csrf]", "value")
    response = await page.request.post(
        f"{stack.url}/failures/action",
        form={
            "csrf": csrf or "",
            "action": "discard",
            "scope": "entry",
            "durable": DURABLE,
            "message_id": stack.poison[0],
            "reason": "viewer tries",
            "confirm": "1",
        },
    )
    assert response.status == 403
    assert "viewer is read-only" in await response.text()
    assert (await dead_letter_statuses(stack.env))[stack.poison[0]] == "held"
    await context.close()
    assert "Traceback" not in stack.log("console")


async def test_operator_edits_a_dead_letter_and_retries_it(stack: Stack, browser: Browser) -> None:
    """Edit-and-retry: the operator fixes a poison event's payload in the page's form and it
    is replayed; the read-only user has no form, and her POST is refused."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    target = stack.poison[0]
    entry = f"{stack.url}/failures/entry/{DURABLE}/{target}"
    await _sign_in(page, stack, "ops")
    await page.goto(entry)
    form = page.locator("#edit-entry")
    current = json.loads(await form.locator("textarea[name=payload]").input_value())
    assert current["_ferry_test"] == {"poison": True}
    fixed = {"vibe_id": current["vibe_id"], "title": "fixed in the browser"}
    # A payload its schema refuses first: the page names the field.
    await form.locator("textarea[name=payload]").fill(json.dumps({"vibe_id": current["vibe_id"]}))
    await form.locator("input[name=reason]").fill("drop the test flag")
    await form.locator("button[name=confirm]").click()
    assert "payload.title: required property is missing" in await page.inner_text("main")
    await _shot(page, "12-edit-refused")
    assert (await dead_letter_statuses(stack.env))[target] == "held"
    await page.goto(entry)
    form = page.locator("#edit-entry")
    await form.locator("textarea[name=payload]").fill(json.dumps(fixed, indent=2))
    await form.locator("input[name=reason]").fill("drop the test flag")
    await form.locator("button[name=confirm]").click()
    assert "edited (payload._ferry_test, payload.title) and replayed" in await page.inner_text(
        "#done"
    )
    deadline = time.monotonic() + 30
    while (await dead_letter_statuses(stack.env))[target] != "replayed":
        assert time.monotonic() < deadline, "the edited replay was not processed"
        await asyncio.sleep(0.3)
    await page.reload()
    assert await page.inner_text("#fact-status") == "replayed"
    assert await page.locator("#edit-entry").count() == 0  # final: nothing to edit
    edits = await page.inner_text("#edits")
    assert "fixed in the browser" in edits and "ops@console" in edits
    await _shot(page, "13-edited-and-replayed")
    assert not errors, errors

    # The read-only user: the page of the other poison event offers no edit; a POST is 403.
    await page.click("header form.who button")
    await _sign_in(page, stack, "viewer")
    await page.goto(f"{stack.url}/failures/entry/{DURABLE}/{stack.poison[1]}")
    assert await page.locator("#edit-entry").count() == 0
    assert await page.locator("textarea").count() == 0
    csrf = await page.get_attribute("header form.who input[name=csrf]", "value")
    response = await page.request.post(
        f"{stack.url}/failures/edit",
        form={
            "csrf": csrf or "",
            "durable": DURABLE,
            "message_id": stack.poison[1],
            "payload": json.dumps(fixed),
            "reason": "viewer tries",
        },
    )
    assert response.status == 403
    assert "viewer is read-only" in await response.text()
    assert (await dead_letter_statuses(stack.env))[stack.poison[1]] == "held"
    await context.close()
    assert "Traceback" not in stack.log("console")


async def _inbox_rows(stack: Stack, ids: list[str]) -> tuple[int, int]:
    """(inbox rows, processed ones) of ``ids`` in the durable's own table."""
    conn = await asyncpg.connect(stack.env.dsn("sea"))
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS rows, count(processed_at) AS processed FROM inbox_messages "
            "WHERE durable = $1 AND message_id = ANY($2::uuid[])",
            DURABLE,
            ids,
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["rows"]), int(row["processed"])


async def _pause_actions(stack: Stack) -> list[tuple[str, str, str]]:
    conn = await asyncpg.connect(stack.env.dsn("sea"))
    try:
        rows = await conn.fetch(
            "SELECT action, actor, reason FROM pause_actions WHERE durable = $1 ORDER BY id",
            DURABLE,
        )
    finally:
        await conn.close()
    return [(r["action"], r["actor"], r["reason"]) for r in rows]


async def _until_text(page: Page, url: str, selector: str, wanted: str, timeout: float) -> str:
    """Reload ``url`` until ``selector``'s text contains ``wanted``; that text."""
    deadline = time.monotonic() + timeout
    while True:
        await page.goto(url)
        found = page.locator(selector)
        text = await found.inner_text() if await found.count() else ""
        if wanted in text:
            return text
        assert time.monotonic() < deadline, f"{selector} never showed {wanted!r}: {text!r}"
        await asyncio.sleep(0.5)


async def test_operator_pauses_and_resumes_a_lane_and_sees_its_circuit_breaker(
    stack: Stack, browser: Browser
) -> None:
    """Pause and resume from the durable's page: while paused nothing reaches the inbox
    (counted in its table), the overview marks the lane, and on resume every event is
    processed. A failing handler opens the breaker: the page and the overview show it
    until a probe closes it. The read-only user has no buttons; her POST is refused."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    lane = f"{stack.url}/durables/{DURABLE}"
    await _sign_in(page, stack, "ops")
    await page.click(f"#durable-link-{DURABLE}")
    assert page.url == lane
    assert "Running" in await page.inner_text("#pause-state")
    await _until_text(page, lane, "#breakers", "closed", timeout=20)

    await page.fill("#pause-form input[name=reason]", "handler team deploys a fix")
    await page.click("#pause-form button[name=confirm]")
    assert "paused until resumed on 1 consumer(s)" in await page.inner_text("#done")
    assert "by ops@console" in await page.inner_text("#pause-state")
    assert await page.locator("#pause-form").count() == 0
    waiting = [await record(stack.env) for _ in range(3)]
    await asyncio.sleep(5.0)  # past the durable's ack_wait (3 s): nothing delivered
    assert await _inbox_rows(stack, waiting) == (0, 0)
    await page.goto(f"{stack.url}/")
    assert "paused until resumed" in await page.inner_text(f"#paused-{DURABLE}")
    await _shot(page, "14-overview-paused")
    await page.goto(lane)
    await _shot(page, "15-durable-paused")
    await page.fill("#resume-form input[name=reason]", "fix deployed")
    await page.click("#resume-form button[name=confirm]")
    assert "resumed on 1 consumer(s)" in await page.inner_text("#done")
    deadline = time.monotonic() + 30
    while await _inbox_rows(stack, waiting) != (3, 3):
        assert time.monotonic() < deadline, "the events of the pause were not processed"
        await asyncio.sleep(0.3)
    assert await _pause_actions(stack) == [
        ("pause", "ops@console", "handler team deploys a fix"),
        ("resume", "ops@console", "fix deployed"),
    ]
    history = await page.inner_text("#pause-history")
    assert "handler team deploys a fix" in history and "fix deployed" in history

    # The handler hangs (SIGSTOP: every call times out after 2 s): five failures open the
    # breaker, which holds the events and probes every 10 s; back (SIGCONT), the next
    # probe closes it.
    handler = stack.procs["handler-sea"]
    os.kill(handler.pid, signal.SIGSTOP)
    try:
        failing = [await record(stack.env) for _ in range(8)]
        opened = await _until_text(page, lane, "#breakers", "open", timeout=40)
        assert "half-open" in opened or "open" in opened.split()
        await _shot(page, "16-durable-breaker-open")
        await page.goto(f"{stack.url}/")
        circuit = page.locator(f"#circuit-{DURABLE}")
        assert "circuit open on 1 of 1" in await circuit.inner_text()
        await _shot(page, "17-overview-breaker-open")
    finally:
        os.kill(handler.pid, signal.SIGCONT)
    await _until_text(page, lane, "#breakers", "closed", timeout=40)
    deadline = time.monotonic() + 30
    while await _inbox_rows(stack, failing) != (8, 8):
        assert time.monotonic() < deadline, "the events held by the breaker were not processed"
        await asyncio.sleep(0.3)
    assert not errors, errors

    # The read-only user: no buttons; a POST is refused and records nothing.
    await page.click("header form.who button")
    await _sign_in(page, stack, "viewer")
    await page.goto(lane)
    assert await page.locator("#pause-form").count() == 0
    assert "Read-only" in await page.inner_text("main")
    csrf = await page.get_attribute("header form.who input[name=csrf]", "value")
    response = await page.request.post(
        f"{lane}/pause", form={"csrf": csrf or "", "reason": "viewer tries"}
    )
    assert response.status == 403
    assert len(await _pause_actions(stack)) == 2
    await context.close()
    assert "Traceback" not in stack.log("console")
