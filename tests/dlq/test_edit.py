"""``ferry dlq edit``: edit-and-retry of a dead letter, as an operator runs it (a
subprocess, real servers). Each outcome is counted against a record the command does not
write: the scripted handler's own calls, the stream's message count, the rows as they were."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from tests.conftest import ROOT, Env
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    publish,
)
from tests.dlq.support import rows as fetch
from tests.helpers import eventually, stream_count

pytestmark = pytest.mark.integration


async def run(env: Env, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        cwd=ROOT,
        env=env.settings_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def snapshot(env: Env, nc: NATS) -> tuple[Any, ...]:
    """Everything an edit would change: the dead letters, the audits, the inbox, the stream."""
    dead = await fetch(env, "SELECT message_id, status, record::text, replay_attempts "
                            "FROM dead_letters ORDER BY message_id")  # fmt: skip
    audit = await fetch(env, "SELECT count(*) FROM dead_letter_actions")
    edits = await fetch(env, "SELECT count(*) FROM dead_letter_edits")
    inbox = await fetch(env, "SELECT message_id, status FROM inbox_messages ORDER BY message_id")
    return (
        [tuple(r) for r in dead],
        audit[0][0],
        edits[0][0],
        [tuple(r) for r in inbox],
        await stream_count(nc.jetstream(), STREAM),
    )


@pytest.fixture
async def rejected(world: Env, nc: NATS, handler: ScriptedHandler) -> list[str]:
    """Two events whose payload the handler rejects (422: a bad title), dead-lettered."""
    events = [envelope(title="bad"), envelope(title="bad too")]
    for event in events:
        handler.scripts[event.message_id] = [422]
    async with RunningConsumer(world, nc, handler.url):
        for event in events:
            await publish(nc, event)

        async def both() -> bool:
            return len(await fetch(world, "SELECT 1 FROM dead_letters")) == 2

        await eventually(both, timeout=30, what="two dead letters")
    return [e.message_id for e in events]


def _payload_file(tmp_path: Path, payload: Any, name: str = "payload.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(payload) if not isinstance(payload, str) else payload)
    return str(path)


async def test_an_edit_is_replayed_once_with_the_edited_payload_and_audited(
    world: Env, nc: NATS, handler: ScriptedHandler, rejected: list[str], tmp_path: Path
) -> None:
    target = rejected[0]
    fixed = {"vibe_id": "v1", "title": "fixed"}
    path = _payload_file(tmp_path, fixed)
    # A dry run shows the change and changes nothing.
    before = await snapshot(world, nc)
    dry = await run(world, "dlq", "edit", DURABLE, target, "--payload-file", path,
                    "--reason", "title typo", "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert '-  "title": "bad"' in dry.stdout and '+  "title": "fixed"' in dry.stdout
    assert "changed: payload.title" in dry.stdout
    assert await snapshot(world, nc) == before

    calls_before = len(handler.calls)
    async with RunningConsumer(world, nc, handler.url):
        out = await run(world, "dlq", "edit", DURABLE, target, "--payload-file", "-",
                        "--reason", "title typo from the producer", "--actor", "alice",
                        stdin=json.dumps(fixed))  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "replayed" in out.stdout and "edit " in out.stdout

        async def processed() -> bool:
            rows = await fetch(
                world,
                "SELECT 1 FROM inbox_messages WHERE message_id = $1 AND status = 'processed'",
                uuid.UUID(target),
            )
            return len(rows) == 1

        await eventually(processed, timeout=30, what="the edited replay processed")
        await asyncio.sleep(1.0)  # time for a second delivery, were there one
    # The handler's own record: one call since, with the edited payload under the same id,
    # applied once; the other dead letter untouched.
    since = handler.calls[calls_before:]
    assert [c["body"]["message_id"] for c in since] == [target]
    [call] = since
    assert call["body"]["payload"] == fixed and call["outcome"] == 200
    assert handler.applied[target] == 1 and handler.applied[rejected[1]] == 0
    assert [c["body"]["payload"]["title"] for c in handler.calls_for(target)] == ["bad", "fixed"]
    # The stream got exactly one message more: the edited replay.
    assert await stream_count(nc.jetstream(), STREAM) == before[4] + 1
    # The audit: both versions, who, why; and an `edit` action linking to it.
    [edit] = await fetch(
        world,
        "SELECT id, original_payload, edited_payload, changed, actor, reason, replay_attempt "
        "FROM dead_letter_edits WHERE durable = $1 AND message_id = $2",
        DURABLE,
        uuid.UUID(target),
    )
    assert json.loads(edit["original_payload"]) == {"vibe_id": "v1", "title": "bad"}
    assert json.loads(edit["edited_payload"]) == fixed
    assert (list(edit["changed"]), edit["actor"], edit["reason"], edit["replay_attempt"]) == (
        ["payload.title"], "alice", "title typo from the producer", 1,
    )  # fmt: skip
    [action] = await fetch(
        world, "SELECT action, actor, details FROM dead_letter_actions WHERE message_id = $1",
        uuid.UUID(target),
    )  # fmt: skip
    details = json.loads(action["details"])
    assert (action["action"], action["actor"]) == ("edit", "alice")
    assert details == {"attempt": 1, "edit_id": edit["id"], "changed": ["payload.title"]}
    # `ferry dlq show` has both versions; `ferry where` names the edit.
    shown = json.loads((await run(world, "dlq", "show", DURABLE, target, "--json")).stdout)
    assert [(e["original_payload"]["title"], e["edited_payload"]["title"])
            for e in shown["edits"]] == [("bad", "fixed")]  # fmt: skip
    where = await run(world, "where", target)
    assert "action edit by alice" in where.stdout, where.stdout + where.stderr
    assert "(edited payload.title)" in where.stdout


async def test_an_edit_the_schema_refuses_is_named_and_changes_nothing(
    world: Env, nc: NATS, rejected: list[str], tmp_path: Path
) -> None:
    target = rejected[0]
    before = await snapshot(world, nc)
    cases = [
        ({"vibe_id": "v1"}, "payload.title: required property is missing"),
        ({"vibe_id": 5, "title": "x"}, "payload.vibe_id: 5 is not of type 'string'"),
        ({"vibe_id": "v1", "title": "bad"}, "the same as the current one"),
    ]
    for index, (payload, words) in enumerate(cases):
        path = _payload_file(tmp_path, payload, f"p{index}.json")
        out = await run(world, "dlq", "edit", DURABLE, target, "--payload-file", path,
                        "--reason", "try")  # fmt: skip
        assert out.returncode == 1, (payload, out.stdout, out.stderr)
        assert words in out.stderr and out.stderr.startswith("refused: "), out.stderr
    # Bad arguments: exit 2, named.
    for args, words in (
        (["--payload-file", _payload_file(tmp_path, "{not json", "bad.json")], "is not JSON"),
        (["--payload-file", _payload_file(tmp_path, [1, 2], "list.json")], "a JSON object"),
        (["--payload-file", str(tmp_path / "missing.json")], "cannot read it"),
    ):
        out = await run(world, "dlq", "edit", DURABLE, target, *args, "--reason", "try")
        assert out.returncode == 2 and words in out.stderr, out.stderr
    out = await run(world, "dlq", "edit", DURABLE, target, "--payload-file", "-")
    assert out.returncode == 2 and "--reason" in out.stderr
    assert await snapshot(world, nc) == before


async def test_an_edit_of_a_final_dead_letter_is_refused(
    world: Env, nc: NATS, rejected: list[str], tmp_path: Path
) -> None:
    target = rejected[1]
    gone = await run(world, "dlq", "discard", DURABLE, target, "--reason", "test data")
    assert gone.returncode == 0, gone.stderr
    before = await snapshot(world, nc)
    path = _payload_file(tmp_path, {"vibe_id": "v1", "title": "fixed"})
    out = await run(world, "dlq", "edit", DURABLE, target, "--payload-file", path,
                    "--reason", "too late")  # fmt: skip
    assert out.returncode == 1 and "is discarded" in out.stderr, out.stderr
    missing = await run(world, "dlq", "edit", DURABLE, str(uuid.uuid4()), "--payload-file", path,
                        "--reason", "nothing")  # fmt: skip
    assert missing.returncode == 1 and "no dead letter" in missing.stderr
    assert await snapshot(world, nc) == before
