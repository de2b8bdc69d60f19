"""``ferry durable rewind`` against a real nats-server, PostgreSQL and the role's consumer.

The scripted handler is the independent record: it logs every call and applies each
message id at most once, so "processed again" and "applied twice" are counted outside
the inbox. Other durables of the stream are checked through JetStream's own counts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from shared.access.streams import provision
from shared.adapters.dead_letters.replay import replay
from shared.domain.errors import TransientError
from shared.domain.ordering import partition_of
from shared.ops.rewind import RewindResult, rewind
from shared.ops.rewind_range import RewindRange, RewindRefused
from shared.runtime.settings import CommonSettings
from tests.conftest import CAPS, Env
from tests.consumer.conftest import (
    DURABLE,
    STREAM,
    RunningConsumer,
    ScriptedHandler,
    envelope,
    fast_durable,
    publish,
    publish_raw,
)
from tests.helpers import eventually, stream_messages

OTHER = "audit__from_vibespro"


def settings_of(env: Env) -> CommonSettings:
    databases = {c.database: env.dsn(name) for name, c in env.topology.contexts.items()}
    return CommonSettings(topology=env.path, databases=databases, nats_url=env.nats_url)


async def run_rewind(env: Env, nc: NATS, span: RewindRange, **kw: Any) -> RewindResult:
    kw.setdefault("actor", "test")
    kw.setdefault("reason", "database restored")
    kw.setdefault("durable", DURABLE)
    return await rewind(settings_of(env), env.topology, nc, span=span, **kw)


async def until(check: Any, what: str, timeout: float = 30) -> None:
    async def poll() -> bool:
        return bool(check())

    await eventually(poll, timeout=timeout, what=what)


async def sea_rows(env: Env, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(env.dsn("sea"))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def two_durables(env: Env, nc: NATS, handler: ScriptedHandler, **overrides: Any) -> None:
    """sea__from_vibespro and a second durable on the same stream (never consumed here)."""
    other = dict(env.doc["durables"][DURABLE])
    other["dead_letter_subject"] = f"sea.dlq.{OTHER}"
    env.doc["durables"][OTHER] = other
    fast_durable(env, handler.url, **overrides)
    await provision(nc.jetstream(), env.topology, caps=CAPS)


async def publish_events(nc: NATS, count: int, **payload: Any) -> list[str]:
    ids = []
    for index in range(count):
        event = envelope(vibe_id=f"v{index % 7}", title=f"t{index}", **payload)
        await publish(nc, event)
        ids.append(event.message_id)
    return ids


async def pending(nc: NATS, consumer: str) -> tuple[int, int]:
    """(num_pending, delivered stream seq) of a JetStream consumer."""
    info = await nc.jetstream().consumer_info(STREAM, consumer)
    return int(info.num_pending or 0), int(info.delivered.stream_seq or 0)


async def test_a_rewind_re_delivers_what_was_lost_and_only_to_its_durable(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await two_durables(env, nc, handler)
    ids = await publish_events(nc, 40)
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 40, "the 40 events processed")
    assert sorted(handler.applied) == sorted(ids)
    assert await pending(nc, OTHER) == (40, 0)

    # 1. Everything was processed: every copy is a duplicate, the handler is not called.
    done = await run_rewind(env, nc, RewindRange(from_seq=1))
    assert (done.selected, done.published, done.skipped) == (40, 40, 0)
    assert (done.first_seq, done.last_seq, done.stop_seq) == (1, 40, 40)
    assert done.by_subject == {"vibespro.event.vibe_created.v1": 40}
    calls = len(handler.calls)
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.duplicates == 40, "40 duplicates")
        await asyncio.sleep(0.5)
        assert consumer.stats.processed == 0
    assert len(handler.calls) == calls, "a duplicate must not reach the handler"
    assert set(handler.applied.values()) == {1}

    # 2. A restore lost 10 of them (inbox rows and the handler's effects): exactly those
    #    are processed again.
    lost = ids[5:15]
    await sea_rows(
        env,
        "DELETE FROM inbox_messages WHERE durable = $1 AND message_id = ANY($2::uuid[])",
        DURABLE,
        [uuid.UUID(m) for m in lost],
    )
    for mid in lost:
        del handler.applied[mid]
    calls_before = Counter(c["body"]["message_id"] for c in handler.calls)
    again = await run_rewind(env, nc, RewindRange(from_seq=1, until_seq=40))
    assert (again.selected, again.published) == (40, 40)
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(
            lambda: consumer.stats.processed == 10 and consumer.stats.duplicates == 30,
            "10 processed and 30 duplicates",
        )
    calls_after = Counter(c["body"]["message_id"] for c in handler.calls)
    assert {m for m in ids if calls_after[m] != calls_before[m]} == set(lost)
    assert all(calls_after[m] == calls_before[m] + 1 for m in lost)
    assert set(handler.applied.values()) == {1} and sorted(handler.applied) == sorted(ids)
    inbox = await sea_rows(env, "SELECT status FROM inbox_messages WHERE durable = $1", DURABLE)
    assert Counter(r["status"] for r in inbox) == {"processed": 40}

    # The other durable of the stream was offered nothing beyond the 40 events.
    assert await pending(nc, OTHER) == (40, 0)

    # Each copy travelled on the durable's replay subject, marked as a rewind's.
    copies = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.seq > 40]
    assert len(copies) == 80
    assert {m.subject for m in copies} == {f"ferry.replay.{STREAM}.{DURABLE}"}
    first = [m for m in copies if m.headers["Ferry-Rewind"] == str(done.rewind_id)]
    assert [m.msg_id for m in first] == [f"rewind:{done.rewind_id}:{mid}" for mid in ids]
    assert [m.body["message_id"] for m in first] == ids

    # Audited, both.
    audit = await sea_rows(env, "SELECT * FROM durable_rewinds ORDER BY started_at")
    assert [r["id"] for r in audit] == [done.rewind_id, again.rewind_id]
    row = audit[1]
    assert (row["durable"], row["stream"], row["from_seq"], row["until_seq"]) == (
        DURABLE, STREAM, 1, 40,
    )  # fmt: skip
    assert (row["first_seq"], row["last_seq"], row["selected"], row["published"]) == (
        1, 40, 40, 40,
    )  # fmt: skip
    assert (row["outcome"], row["dry_run"], row["actor"]) == ("done", False, "test")
    assert row["reason"] == "database restored" and row["finished_at"] is not None


async def test_a_dry_run_counts_by_subject_and_publishes_nothing(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await two_durables(env, nc, handler)
    await publish_events(nc, 6)
    for _ in range(4):
        await publish(nc, envelope(version=2))
    # Not an envelope (the consumer dead-lettered it when it came): selected, not carried.
    await publish_raw(nc, "vibespro.event.vibe_created.v1", b"not json", str(uuid.uuid4()))
    seen: list[tuple[int, int]] = []
    result = await run_rewind(
        env, nc, RewindRange(from_seq=3), dry_run=True, progress=lambda d, s: seen.append((d, s))
    )
    assert (result.selected, result.skipped, result.published) == (9, 1, 0)
    assert result.dry_run and (result.first_seq, result.last_seq) == (3, 11)
    assert result.by_subject == {
        "vibespro.event.vibe_created.v1": 5,
        "vibespro.event.vibe_created.v2": 4,
    }
    assert seen and seen[-1] == (9, 9)
    info = await nc.jetstream().stream_info(STREAM)
    assert info.state.last_seq == 11, "a dry run publishes nothing"
    [row] = await sea_rows(env, "SELECT * FROM durable_rewinds")
    assert (row["dry_run"], row["selected"], row["published"], row["outcome"]) == (
        True, 9, 0, "done",
    )  # fmt: skip
    assert json.loads(row["by_subject"]) == result.by_subject
    done = await run_rewind(env, nc, RewindRange(from_seq=3))
    assert (done.selected, done.skipped, done.published) == (9, 1, 8)
    assert (await nc.jetstream().stream_info(STREAM)).state.last_seq == 19


async def test_since_and_until_select_by_the_time_the_stream_stored_them(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await two_durables(env, nc, handler)
    await publish_events(nc, 5)
    await asyncio.sleep(0.3)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.3)
    await publish_events(nc, 7)
    after = await run_rewind(env, nc, RewindRange(since=middle), dry_run=True)
    assert (after.selected, after.first_seq, after.last_seq) == (7, 6, 12)
    before = await run_rewind(
        env, nc, RewindRange(since=middle - timedelta(minutes=5), until=middle), dry_run=True
    )
    assert (before.selected, before.first_seq, before.last_seq) == (5, 1, 5)
    none = await run_rewind(env, nc, RewindRange(since=datetime.now(UTC)), dry_run=True)
    assert (none.selected, none.first_seq) == (0, None)


async def test_a_range_older_than_the_stream_keeps_is_refused_naming_what_is_left(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    await two_durables(env, nc, handler)
    await publish_events(nc, 10)
    js = nc.jetstream()
    await js.purge_stream(STREAM, seq=6)  # sequences 1..5 are gone
    with pytest.raises(RewindRefused) as caught:
        await run_rewind(env, nc, RewindRange(from_seq=2))
    assert "keeps sequences 6..10" in str(caught.value)
    with pytest.raises(RewindRefused, match=r"keeps sequences 6\.\.10, the first stored at"):
        await run_rewind(env, nc, RewindRange(since=datetime.now(UTC) - timedelta(hours=1)))
    assert (await js.stream_info(STREAM)).state.last_seq == 10
    assert await sea_rows(env, "SELECT * FROM durable_rewinds") == []
    ok = await run_rewind(env, nc, RewindRange(from_seq=6), dry_run=True)
    assert ok.selected == 5


async def test_an_ordered_durable_gets_each_copy_on_its_keys_partition(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    env.doc["contexts"]["vibespro"]["stream"]["partitions"] = 4
    fast_durable(env, handler.url, ordering="key")
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    keys = [f"k{i}" for i in range(12)]
    for key in keys:
        event = envelope(vibe_id=key)
        k = partition_of(f"vibe/{key}", 4)
        await nc.jetstream().publish(
            f"{event.subject}.{k}", event.to_wire(), headers={"Nats-Msg-Id": event.message_id}
        )
    result = await run_rewind(env, nc, RewindRange(from_seq=1))
    assert (result.selected, result.published) == (12, 12)
    assert result.by_subject == {"vibespro.event.vibe_created.v1": 12}
    copies = [m for m in await stream_messages(nc.jetstream(), STREAM) if m.seq > 12]
    wanted = [f"ferry.replay.{STREAM}.{DURABLE}.{partition_of(f'vibe/{k}', 4)}" for k in keys]
    assert [m.subject for m in copies] == wanted
    per_partition = Counter(partition_of(f"vibe/{k}", 4) for k in keys)
    for k in range(4):
        assert await pending(nc, f"{DURABLE}_p{k}") == (2 * per_partition[k], 0)


async def test_a_rewind_does_not_un_hold_a_key_held_by_a_dead_letter(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url, ordering="key", on_dead_letter="hold")
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    order: dict[str, list[str]] = {"held": [], "free": []}
    for index in range(3):
        for key in order:
            event = envelope(vibe_id=key, title=f"{key}-{index}")
            order[key].append(event.message_id)
            await publish(nc, event)
    head = order["held"][0]
    handler.scripts[head] = [422]
    async with RunningConsumer(env, nc, handler.url) as consumer:
        await until(lambda: consumer.stats.processed == 3, "the free key's 3 processed")
        await until(lambda: consumer.stats.parked == 3, "the held key's 3 parked")
        await run_rewind(env, nc, RewindRange(from_seq=1))
        await until(
            lambda: consumer.stats.duplicates >= 3 and consumer.stats.parked >= 6,
            "the copies settled",
        )
        await asyncio.sleep(1.0)
        assert len(handler.calls_for(head)) == 1, "a rewind must not retry a held dead letter"
        parked = await sea_rows(
            env,
            "SELECT state FROM parked_messages WHERE durable = $1 ORDER BY stream_seq",
            DURABLE,
        )
        assert [r["state"] for r in parked] == ["held", "queued", "queued"]
        conn = await asyncpg.connect(env.dsn("sea"))
        try:
            await replay(
                conn,
                nc.jetstream(),
                durable=DURABLE,
                message_id=uuid.UUID(head),
                actor="test",
                reason="fixed",
                automatic=False,
                topology=env.topology,
            )
        finally:
            await conn.close()
        await until(lambda: consumer.stats.processed == 6, "the held key released")
    assert set(handler.applied.values()) == {1} and len(handler.applied) == 6


async def ferry(env: Env, *args: str, role: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shared.cli", *args],
        env=env.settings_env(role=role),
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_command_as_the_operator_console_identity(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await publish_events(nc, 25)
    role = "console-sea-vibespro"
    done = await ferry(env, "durable", "rewind", "--durable", DURABLE, "--since", "1h",
                       "--reason", "restore drill", "--json", role=role)  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["selected"], doc["published"], doc["first_seq"], doc["last_seq"]) == (
        25, 25, 1, 25,
    )  # fmt: skip
    human = await ferry(env, "durable", "rewind", "--topology", str(env.path), "--durable",
                        DURABLE, "--from-seq", "20", "--dry-run", "--reason", "look",
                        "--actor", "me", role=role)  # fmt: skip
    assert human.returncode == 0, human.stderr
    assert "6 would be re-delivered" in human.stdout
    assert "vibespro.event.vibe_created.v1" in human.stdout
    [dry] = await sea_rows(env, "SELECT actor FROM durable_rewinds WHERE dry_run")
    assert dry["actor"] == "me"
    refused = await ferry(env, "durable", "rewind", "--durable", "nope", "--from-seq", "1",
                          "--reason", "x")  # fmt: skip
    assert refused.returncode == 2 and "no durable 'nope'" in refused.stderr
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    future = await ferry(env, "durable", "rewind", "--durable", DURABLE, "--since", later,
                         "--reason", "x")  # fmt: skip
    assert future.returncode == 2 and "in the future" in future.stderr
    both = await ferry(env, "durable", "rewind", "--durable", DURABLE, "--since", "1h",
                       "--from-seq", "1", "--reason", "x")  # fmt: skip
    assert both.returncode == 2 and "not allowed with" in both.stderr
    neither = await ferry(env, "durable", "rewind", "--durable", DURABLE, "--reason", "x")
    assert neither.returncode == 2 and "exactly one start" in neither.stderr


async def test_an_interrupted_rewind_stays_visible_as_unfinished(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    fast_durable(env, handler.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    js = nc.jetstream()
    pending_acks = []
    for index in range(3000):
        event = envelope(vibe_id=f"v{index % 9}")
        pending_acks.append(
            await js.publish_async(
                event.subject, event.to_wire(), headers={"Nats-Msg-Id": event.message_id}
            )
        )
    await asyncio.gather(*pending_acks)
    started = asyncio.Event()

    def progress(done: int, selected: int) -> None:
        if done:
            started.set()

    task = asyncio.create_task(run_rewind(env, nc, RewindRange(from_seq=1), progress=progress))
    await asyncio.wait_for(started.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [row] = await sea_rows(env, "SELECT * FROM durable_rewinds")
    assert row["outcome"] == "interrupted" and row["finished_at"] is not None
    assert 0 < row["published"] < 3000 and row["selected"] < 3000


async def test_a_copy_the_stream_refuses_fails_the_rewind_and_the_audit_says_so(
    env: Env, nc: NATS, handler: ScriptedHandler
) -> None:
    env.doc["contexts"]["vibespro"]["stream"]["max_msg_size"] = "4KB"
    fast_durable(env, handler.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    await publish_events(nc, 3)
    big = envelope(vibe_id="big", title="")
    big.payload["title"] = "x" * (4000 - 120 - len(big.to_wire()))  # fits with its own headers,
    assert 3800 < len(big.to_wire()) < 4000  # not with the copy's (about 250 bytes more)
    await publish(nc, big)
    with pytest.raises(TransientError, match=r"copy of sequence 4 .* after 4 attempts"):
        await run_rewind(env, nc, RewindRange(from_seq=1))
    [row] = await sea_rows(env, "SELECT * FROM durable_rewinds")
    assert (row["outcome"], row["selected"], row["published"]) == ("failed", 4, 3)
    assert "sequence 4" in row["error"] and row["finished_at"] is not None
