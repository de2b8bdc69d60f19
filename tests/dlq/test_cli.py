"""``ferry dlq``: every command, as an operator runs it (a subprocess, real servers)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from tests.conftest import Env, ferry
from tests.consumer.conftest import (
    DURABLE,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    publish,
    publish_raw,
)
from tests.helpers import eventually

pytestmark = pytest.mark.integration


async def run(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(ferry, env, *args)


async def count(env: Env, sql: str, *params: Any) -> int:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return int(await conn.fetchval(sql, *params))
    finally:
        await conn.close()


@pytest.fixture
async def failed(world: Env, nc: NATS, handler: ScriptedHandler) -> list[str]:
    """Three events the handler rejects (422) and one malformed message, dead-lettered."""
    events = [envelope(), envelope(), envelope()]
    for event in events:
        handler.scripts[event.message_id] = [422]
    async with RunningConsumer(world, nc, handler.url):
        for event in events:
            await publish(nc, event)
        await publish_raw(nc, "vibespro.event.vibe_created.v1", b"{not json", str(uuid.uuid4()))
        await eventually(lambda: _n(world, 4), timeout=30, what="four dead letters")
    return [e.message_id for e in events]


async def _n(env: Env, n: int) -> bool:
    return await count(env, "SELECT count(*) FROM dead_letters") >= n


async def test_list_and_filters(world: Env, failed: list[str]) -> None:
    out = await run(world, "dlq", "list")
    assert out.returncode == 0, out.stderr
    assert "4 dead letter(s)" in out.stdout and all(m in out.stdout for m in failed)
    out = await run(world, "dlq", "list", "--reason-code", "MALFORMED_JSON", "--json")
    [row] = json.loads(out.stdout)
    assert row["status"] == "held"  # bytes that can never parse are not auto-replayed
    out = await run(world, "dlq", "list", "--status", "dead", "--json")
    assert sorted(r["message_id"] for r in json.loads(out.stdout)) == sorted(failed)
    out = await run(world, "dlq", "list", "--subject", "vibespro.event.*.v1", "--since", "1h")
    assert "4 dead letter(s)" in out.stdout
    out = await run(world, "dlq", "list", "--subject", "sea.event.>")
    assert out.stdout.strip() == "no dead letters match"
    out = await run(world, "dlq", "list", "--until", "1h")
    assert out.stdout.strip() == "no dead letters match"


async def test_show(world: Env, failed: list[str]) -> None:
    out = await run(world, "dlq", "show", DURABLE, failed[0])
    assert out.returncode == 0, out.stderr
    assert "HANDLER_REJECTED" in out.stdout and '"vibe_id": "v1"' in out.stdout
    doc = json.loads((await run(world, "dlq", "show", DURABLE, failed[0], "--json")).stdout)
    assert doc["record"]["retryHistory"][-1]["status"] == 422 and doc["actions"] == []
    missing = await run(world, "dlq", "show", DURABLE, str(uuid.uuid4()))
    assert missing.returncode == 1 and "no dead letter" in missing.stderr


async def test_replay_dry_run_then_for_real(
    world: Env, nc: NATS, handler: ScriptedHandler, failed: list[str]
) -> None:
    dry = await run(world, "dlq", "replay", DURABLE, failed[0], "--reason", "fixed", "--dry-run")
    assert dry.returncode == 0 and "would replay" in dry.stdout
    assert await count(world, "SELECT count(*) FROM dead_letter_actions") == 0
    calls = len(handler.calls)
    async with RunningConsumer(world, nc, handler.url):  # the handler now accepts it
        out = await run(
            world, "dlq", "replay", DURABLE, failed[0], "--reason", "bug 42 fixed",
            "--actor", "alice",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        await eventually(
            lambda: _processed(world, failed[0]), timeout=30, what="the replay processed"
        )
    assert len(handler.calls) == calls + 1 and handler.applied[failed[0]] == 1
    doc = json.loads((await run(world, "dlq", "show", DURABLE, failed[0], "--json")).stdout)
    [action] = doc["actions"]
    assert (action["action"], action["actor"], action["reason"]) == (
        "replay", "alice", "bug 42 fixed",
    )  # fmt: skip


async def _processed(env: Env, message_id: str) -> bool:
    status = await count(
        env,
        "SELECT count(*) FROM inbox_messages WHERE message_id = $1 AND status = 'processed'",
        uuid.UUID(message_id),
    )
    return status == 1


async def test_a_filter_needs_all_and_respects_the_rate(world: Env, failed: list[str]) -> None:
    many = await run(world, "dlq", "replay", "--reason-code", "HANDLER_REJECTED", "--reason", "x")
    assert many.returncode == 2 and "3 dead letters match; add --all" in many.stderr
    out = await run(
        world, "dlq", "replay", "--reason-code", "HANDLER_REJECTED", "--reason", "retry all",
        "--all", "--rate", "20",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "3 replayed, 0 refused" in out.stdout
    replayed = await count(
        world,
        "SELECT count(*) FROM dead_letters WHERE status = 'replaying' AND replay_attempts = 1",
    )
    assert replayed == 3


async def test_park_discard_and_refusals(world: Env, failed: list[str]) -> None:
    no_reason = await run(world, "dlq", "park", DURABLE, failed[0])
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    parked = await run(world, "dlq", "park", DURABLE, failed[0], "--reason", "waiting on vendor")
    assert parked.returncode == 0 and "parked" in parked.stdout
    gone = await run(world, "dlq", "discard", DURABLE, failed[1], "--reason", "test data")
    assert gone.returncode == 0
    again = await run(world, "dlq", "replay", DURABLE, failed[1], "--reason", "oops")
    assert again.returncode == 1 and "is discarded" in again.stderr
    malformed = await run(
        world, "dlq", "replay", "--reason-code", "MALFORMED_JSON", "--reason", "try"
    )
    assert malformed.returncode == 1 and "no parseable envelope" in malformed.stderr
    actions = await count(world, "SELECT count(*) FROM dead_letter_actions")
    assert actions == 2  # park and discard; refusals change nothing


async def test_export_json_lines(world: Env, failed: list[str], tmp_path: Path) -> None:
    target = tmp_path / "dlq.jsonl"
    out = await run(world, "dlq", "export", "--durable", DURABLE, "--output", str(target))
    assert out.returncode == 0 and "exported 4" in out.stderr
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(rows) == 4 and {r["durable"] for r in rows} == {DURABLE}
    assert all("record" in r and "retryHistory" in r["record"] for r in rows)


async def test_bad_arguments_are_named(world: Env, failed: list[str]) -> None:
    cases = {
        ("dlq", "show", DURABLE, "not-a-uuid"): "is not a message id",
        ("dlq", "list", "--since", "yesterday-ish"): "neither an RFC 3339 time nor a duration",
        ("dlq", "list", "--durable", "nope"): "has no durable 'nope'",
        ("dlq", "replay", DURABLE, "--reason", "x"): "DURABLE MESSAGE_ID (two values)",
        ("dlq", "replay", "--reason", "x"): "give at least one filter",
        ("dlq", "replay", DURABLE, failed[0], "--reason", "x", "--rate", "0"): "greater than 0",
        ("dlq", "list", "--status", "lost"): "invalid choice",
    }
    for args, message in cases.items():
        out = await run(world, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert message in out.stderr, (args, out.stderr)
