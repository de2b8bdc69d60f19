"""``ferry handler-check`` against real handlers: Ferry's own example service is green, a
hand-made one keeping the contract is green, and each deliberate breach is reported."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import asyncpg
import pytest

from devstack.ports import free_port
from shared.ops.handler_check import Report, run_checks
from shared.ops.handler_check_calls import plan_for
from shared.ops.handler_check_send import EffectProbe
from tests.conftest import ROOT, Env
from tests.helpers import eventually

from .conftest import DURABLE, EFFECT_SQL, SECRET, hand_made

pytestmark = pytest.mark.integration

#: The example sea handler's own effect: one row per vibe, its time on every write.
SEA_EFFECT_SQL = "SELECT count(*), max(updated_at) FROM handler_sea_vibes"


async def ferry_check(world: Env, url: str, *options: str) -> tuple[int, dict[str, Any]]:
    """Run ``ferry handler-check URL --durable DURABLE --json`` as a process."""
    argv = [sys.executable, "-m", "shared.cli", "handler-check", url, "--durable", DURABLE]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        *options,
        "--json",
        cwd=ROOT,
        env=world.settings_env(FERRY_HANDLER_SECRET=SECRET),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    try:
        doc = json.loads(out)
    except ValueError:
        raise AssertionError(f"exit {proc.returncode}: {out!r} {err!r}") from None
    return proc.returncode, doc


def _spawn_example(world: Env, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "services.handlers", "--service", "sea", "--port", str(port)]
    secrets = json.dumps({DURABLE: SECRET})
    with open(world.tmp_path / "handler.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=log,
            env=world.settings_env(command=argv, FERRY_HANDLER_SECRETS=secrets),
        )


@asynccontextmanager
async def example_handler(world: Env) -> AsyncIterator[str]:
    """``python -m services.handlers --service sea`` with the durable's secret; its URL."""
    port = free_port()
    proc = _spawn_example(world, port)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:

            async def ready() -> bool:
                assert proc.poll() is None, (world.tmp_path / "handler.log").read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(ready, timeout=30, what="the sea handler ready")
        yield f"http://127.0.0.1:{port}/handle"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 20)
        finally:
            if proc.poll() is None:
                proc.kill()


def verdicts(doc: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(r["check"], r["event"]): r["verdict"] for r in doc["results"]}


def breaches(report: Report) -> set[str]:
    return {r.check for r in report.results if r.verdict == "breach"}


async def test_ferrys_example_handler_conforms(world: Env) -> None:
    async with example_handler(world) as url:
        code, doc = await ferry_check(world, url, "--effect-sql", SEA_EFFECT_SQL)
    assert code == 0, json.dumps(doc, indent=2)
    assert doc["conforms"] is True
    checks = verdicts(doc)
    # Every check, for both versions the durable accepts; all conform.
    assert set(checks.values()) == {"conforms"}
    for event in ("vibe_created.v1", "vibe_created.v2"):
        for check in ("normal", "duplicate", "poison"):
            assert (check, event) in checks
    assert {c for c, _ in checks} >= {
        "unsigned",
        "bad-signature",
        "altered-body",
        "expired-timestamp",
        "unknown-version",
        "unknown-type",
    }
    by_check = {(r["check"], r["event"]): r for r in doc["results"]}
    normal = by_check[("normal", "vibe_created.v2")]
    assert normal["answer"] == "200" and normal["effect_changed"] is True
    duplicate = by_check[("duplicate", "vibe_created.v2")]
    assert duplicate["answer"] == "409" and duplicate["effect_changed"] is False
    assert "ack it" in duplicate["consumer"]
    assert (
        "dead-letter it as HANDLER_REJECTED" in by_check[("poison", "vibe_created.v1")]["consumer"]
    )


async def test_without_the_secret_or_the_handler_it_exits_2(world: Env) -> None:
    port = free_port()  # nothing listens there
    code, doc = await ferry_check(world, f"http://127.0.0.1:{port}/handle")
    assert code == 2 and "cannot reach" in doc["error"]
    argv = [
        sys.executable,
        "-m",
        "shared.cli",
        "handler-check",
        "http://127.0.0.1:1/handle",
        "--durable",
        DURABLE,
    ]
    done = await asyncio.to_thread(
        subprocess.run, argv, cwd=ROOT, env=world.settings_env(), capture_output=True, timeout=60
    )
    assert done.returncode == 2 and b"FERRY_HANDLER_SECRET" in done.stderr


async def check(world: Env, url: str, *, effects: bool = True) -> Report:
    plan = plan_for(world.topology, DURABLE)
    conn = await asyncpg.connect(world.dsn("sea"))
    try:
        probe = EffectProbe(conn, EFFECT_SQL) if effects else None
        return await run_checks(plan, url, SECRET.encode(), timeout=5, effects=probe)
    finally:
        await conn.close()


async def test_a_hand_made_handler_keeping_the_contract_conforms(world: Env) -> None:
    async with hand_made(world) as url:
        report = await check(world, url)
    assert report.exit_code() == 0, report.render()
    assert report.counts()["unverified"] == 0


@pytest.mark.parametrize(
    ("fault", "breached"),
    [
        (
            "accepts-bad-signature",
            {"unsigned", "bad-signature", "altered-body", "expired-timestamp"},
        ),
        ("ignores-timestamp", {"expired-timestamp"}),
        ("poison-500", {"poison"}),
        ("applies-duplicates", {"duplicate"}),
    ],
)
async def test_each_breach_is_reported(world: Env, fault: str, breached: set[str]) -> None:
    async with hand_made(world, fault) as url:
        report = await check(world, url)
    assert breaches(report) == breached, report.render()
    assert report.exit_code() == 1
    text = report.render()
    assert "BREACH" in text


async def test_a_duplicate_answered_200_is_judged_by_its_effect(world: Env) -> None:
    async with hand_made(world, "duplicate-200-no-effect") as url:
        judged = await check(world, url)
        blind = await check(world, url, effects=False)
    duplicates = [r for r in judged.results if r.check == "duplicate"]
    assert duplicates and all(r.verdict == "conforms" for r in duplicates), judged.render()
    assert all(r.answer == "200" and r.effect_changed is False for r in duplicates)
    # Without a query the effect is invisible: unverified, not a breach (exit 0).
    unseen = [r for r in blind.results if r.check == "duplicate"]
    assert unseen and all(r.verdict == "unverified" for r in unseen)
    assert blind.exit_code() == 0


async def test_the_command_reports_a_breach_with_exit_1(world: Env) -> None:
    async with hand_made(world, "applies-duplicates", "poison-500") as url:
        code, doc = await ferry_check(world, url, "--effect-sql", EFFECT_SQL)
    assert code == 1 and doc["conforms"] is False
    breached = {r["check"] for r in doc["results"] if r["verdict"] == "breach"}
    assert breached == {"duplicate", "poison"}
    duplicate = next(r for r in doc["results"] if r["check"] == "duplicate")
    assert duplicate["answer"] == "200" and duplicate["effect_changed"] is True
    assert "effect" in duplicate["why"]
