"""The faults and operator steps of :mod:`chaos.scenarios`, and reading the hostile log.

Each fault is recorded on the run's :class:`~chaos.faults.Timeline` and counted in the
scenario's ``faults`` counter (the results table's "faults injected").
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

from chaos.faults import FaultRecord, Timeline
from chaos.hostile_handler import read_log
from chaos.roles import ROOT, Role, role_env
from chaos.scenario_accounting import Settled, read_outbox
from chaos.workload import Ledger
from chaos.world import World

#: The reason code of a row set aside after too many refused publishes.
REFUSED = "PUBLISH_REFUSED"
#: Attempts a 40-minute outage leaves on a failing row (the issue's figure is ~47).
FAST_FORWARD_ATTEMPTS = 50
#: PubAcks (and everything else from NATS) later than the publisher's publish timeout.
SILENT_NATS: dict[str, Any] = {
    "type": "latency",
    "stream": "downstream",
    "attributes": {"latency": 1500, "jitter": 0},
}


def _close(
    record: FaultRecord, timeline: Timeline, faults: Counter[str], *, lasting: bool = True
) -> None:
    record.ended = time.time()
    timeline.records.append(record)
    faults[record.kind] += 1
    if lasting:
        faults[f"{record.kind} seconds"] += round(record.ended - record.started)


class LinksDown:
    """``async with``: the named proxies disabled (refused, connections closed)."""

    def __init__(
        self,
        world: World,
        timeline: Timeline,
        faults: Counter[str],
        kind: str,
        links: list[str],
        affects: frozenset[str],
    ) -> None:
        self.world, self.timeline, self.faults, self.links = world, timeline, faults, links
        self.record = FaultRecord(kind, ", ".join(links), 0.0, 0.0, affects=affects)

    async def __aenter__(self) -> None:
        self.record.started = time.time()
        for name in self.links:
            proxy = await asyncio.to_thread(self.world.client.get_proxy, name)
            await asyncio.to_thread(proxy.disable)

    async def __aexit__(self, *_: object) -> None:
        for name in self.links:
            proxy = await asyncio.to_thread(self.world.client.get_proxy, name)
            await asyncio.to_thread(proxy.enable)
        self.record.detail = f"{len(self.links)} link(s) down"
        _close(self.record, self.timeline, self.faults)


class Toxic:
    """``async with``: one toxic on each named proxy."""

    def __init__(
        self,
        world: World,
        timeline: Timeline,
        faults: Counter[str],
        kind: str,
        links: list[str],
        spec: dict[str, Any],
    ) -> None:
        self.world, self.timeline, self.faults = world, timeline, faults
        self.links, self.spec, self.name = links, spec, f"scenario_{kind}"
        self.record = FaultRecord(kind, ", ".join(links), 0.0, 0.0, affects=frozenset({"*"}))

    async def __aenter__(self) -> None:
        self.record.started = time.time()
        for link in self.links:
            proxy = await asyncio.to_thread(self.world.client.get_proxy, link)
            await asyncio.to_thread(proxy.add_toxic, name=self.name, **self.spec)

    async def __aexit__(self, *_: object) -> None:
        for link in self.links:
            proxy = await asyncio.to_thread(self.world.client.get_proxy, link)
            await asyncio.to_thread(proxy.destroy_toxic, self.name)
        self.record.detail = f"{self.spec['type']} {self.spec['attributes']}"
        _close(self.record, self.timeline, self.faults)


async def wait_for_failing_rows(world: World, timeout: float) -> int:
    """Poll until some unpublished row has failed an attempt (or ``timeout``); how many."""
    deadline, failing = time.monotonic() + timeout, 0
    while True:
        failing = 0
        for context, spec in sorted(world.topo.contexts.items()):
            if spec.stream is None:
                continue
            conn = await asyncpg.connect(world.direct_dsn(context), timeout=10)
            try:
                failing += await conn.fetchval(
                    "SELECT count(*) FROM outbox_events"
                    " WHERE published_at IS NULL AND publish_attempts > 0"
                )
            finally:
                await conn.close()
        if failing or time.monotonic() >= deadline:
            return int(failing)
        await asyncio.sleep(0.5)


async def fast_forward(world: World, timeline: Timeline, faults: Counter[str]) -> int:
    """Compress time: every failing row gets the attempts a 40-minute outage leaves."""
    record = FaultRecord("outbox_fast_forward", "every context", 0.0, time.time())
    moved = 0
    for context, spec in sorted(world.topo.contexts.items()):
        if spec.stream is None:
            continue
        conn = await asyncpg.connect(world.direct_dsn(context), timeout=10)
        try:
            status = await conn.execute(
                "UPDATE outbox_events SET publish_attempts = publish_attempts + $1"
                " WHERE published_at IS NULL AND publish_attempts > 0",
                FAST_FORWARD_ATTEMPTS,
            )
        finally:
            await conn.close()
        moved += int(status.split()[-1])
    record.detail = f"{moved} failing rows +{FAST_FORWARD_ATTEMPTS} attempts"
    _close(record, timeline, faults, lasting=False)
    faults["rows fast-forwarded"] += moved
    return moved


async def operator_republish(world: World, timeline: Timeline, faults: Counter[str]) -> int:
    """``ferry outbox republish`` (as an operator) of every row set aside PUBLISH_REFUSED."""
    total = 0
    for context, spec in sorted(world.topo.contexts.items()):
        rows = await read_outbox(world.direct_dsn(context)) if spec.stream else {}
        ids = [i for i, r in rows.items() if r["set_aside"] and r["reason"] == REFUSED]
        if not ids:
            continue
        argv = [sys.executable, "-m", "shared.ops.cli", "outbox", "republish", "--context", context]
        argv += ["--reason", "chaos long-outage: NATS is back", "--actor", "chaos"]
        for message_id in ids:
            argv += ["--id", message_id]
        dsns = {c: world.direct_dsn(c) for c in world.topo.contexts}
        env = role_env(
            {},
            FERRY_TOPOLOGY=str(world.topology_path),
            PYTHONPATH=str(ROOT),
            FERRY_DATABASES=json.dumps(dsns),
        )
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        last = (done.stdout.strip().splitlines() or [done.stderr.strip()[-300:]])[-1]
        timeline.note(
            f"operator: ferry outbox republish --context {context} ({len(ids)} rows)"
            f" exited {done.returncode}: {last}"
        )
        faults["operator republished"] += len(ids)
        total += len(ids)
    return total


def count_hostile_answers(logs: list[Path], faults: Counter[str]) -> None:
    """Count the hostile fronts' answers (calls, not events: a batch call's events share
    one answer) by status, Retry-After kind, body kind, action; and the batch calls."""
    for path in logs:
        for answer in read_log(path):
            if answer.get("index", 0) != 0:
                continue  # a later event of a batch call: its answer is counted once
            size = int(answer.get("batch", 1))
            if size > 1:
                faults["batch calls"] += 1
                faults["events in batch calls"] += size
            action = answer.get("action", "?")
            if action == "status":
                faults[f"answered {answer.get('status')}"] += 1
                faults[f"Retry-After {answer.get('retry_after')}"] += 1
                faults[f"body {answer.get('body')}"] += 1
            elif action != "pass":
                faults[f"{action} (after the real handler answered)"] += 1
            else:
                faults["passed through"] += 1


def _tallies(path: Path) -> dict[str, Counter[str]]:
    """message id -> answers by status, and ``failed`` (answers that spend a delivery).

    The log has one line per event, a batch call's too, with the status that event got
    (its own result when the call passed, ``missing`` when the answer had none for it)."""
    answers: dict[str, Counter[str]] = {}
    for answer in read_log(path):
        tally = answers.setdefault(str(answer.get("message_id")), Counter())
        status = answer.get("status")
        tally[str(status)] += 1
        spoiled = answer.get("action") in ("reset", "trickle", "replaced")
        if spoiled or status not in (200, 401, 403, 409):
            tally["failed"] += 1
    return answers


def dead_letters_without_cause(
    world: World, logs: dict[str, Path], ledger: Ledger, settled: Settled
) -> list[str]:
    """Dead letters of a fronted durable that its hostile handler's answers do not explain.

    HANDLER_BAD_REQUEST needs a 413 for that message, HANDLER_REJECTED a 422, any
    exhaustion at least half of ``max_deliver`` failed answers (401/403 holds spend none).
    """
    out = []
    for durable, path in sorted(logs.items()):
        answers = _tallies(path)
        floor = world.topo.durables[durable].max_deliver // 2
        for intent in ledger.intents.values():
            fate = settled.fate.get(intent.id, "")
            if intent.durable != durable or not fate.startswith("dead_letter:"):
                continue
            reason, tally = fate.split(":", 1)[1], answers.get(intent.id, Counter())
            explained = {
                "HANDLER_BAD_REQUEST": tally["413"] > 0,
                "HANDLER_REJECTED": tally["422"] > 0,
            }.get(reason, tally["failed"] >= floor)
            if not explained:
                out.append(f"{intent.id} ({reason}; answers {dict(tally)})")
    return out


#: A log line naming an exception (``SomeError: what``), not asyncio's leak notices.
_CAUSE = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit))\b:? ?([^\"\\]{0,100})")


def exit_causes(roles: list[Role]) -> Counter[str]:
    """``role: the last exception its log names`` for each run of a role that ended by
    itself (the log's ``--- start #N`` sections, one per process)."""
    causes: Counter[str] = Counter()
    for role in roles:
        if not role.unexpected:
            continue
        try:
            text = role.log_path.read_text(errors="replace")
        except OSError:
            continue
        sections = re.split(r"^--- start #\d+ at [\d.]+$", text, flags=re.M)[1:]
        for section in sections[: len(role.unexpected)]:
            found = [m for m in _CAUSE.finditer(section) if "Unclosed" not in m.group(0)]
            cause = "(no exception)"
            if found:
                what = found[-1].group(2).split(" in position")[0].strip(" {,")
                what = re.sub(r"0x[0-9a-f]+|\b\d{2,}\b", "N", " ".join(what.split()))
                cause = f"{found[-1].group(1)}: {what[:100]}"
            causes[f"{role.name}: {cause}"] += 1
    return causes
