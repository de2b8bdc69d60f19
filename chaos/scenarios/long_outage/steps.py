"""The faults and operator steps of the long outage (:mod:`chaos.scenarios.long_outage.play`).

Each fault is recorded on the run's :class:`~chaos.engine.faults.Timeline` and counted in the
scenario's ``faults`` counter (the results table's "faults injected").
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos.engine import db
from chaos.engine.faults import FaultRecord, Timeline
from chaos.engine.roles import ROOT, role_env
from chaos.engine.scenario import ALL, ScenarioRun
from chaos.engine.settled import read_outbox
from chaos.engine.world import World

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


class LinkFault:
    """``async with``: something done to each named proxy on the way in (``apply``), undone
    on the way out (``undo``); recorded on the timeline and counted."""

    def __init__(
        self,
        run: ScenarioRun,
        record: FaultRecord,
        apply: Callable[[Any], None],
        undo: Callable[[Any], None],
        detail: str,
    ) -> None:
        self.run, self.record, self.apply, self.undo, self.detail = run, record, apply, undo, detail
        self.links = record.target.split(", ")

    async def _each(self, action: Callable[[Any], None]) -> None:
        for name in self.links:
            proxy = await asyncio.to_thread(self.run.world.client.get_proxy, name)
            await asyncio.to_thread(action, proxy)

    async def __aenter__(self) -> None:
        self.record.started = time.time()
        await self._each(self.apply)

    async def __aexit__(self, *_: object) -> None:
        await self._each(self.undo)
        self.record.restored = time.time()  # the recovery counts from here
        self.record.detail = self.detail
        _close(self.record, self.run.timeline, self.run.faults)


def links_down(run: ScenarioRun, kind: str, links: list[str], affects: frozenset[str]) -> LinkFault:
    """The named proxies disabled (refused, connections closed)."""
    record = FaultRecord(kind, ", ".join(links), 0.0, 0.0, affects=affects)
    return LinkFault(
        run, record, lambda p: p.disable(), lambda p: p.enable(), f"{len(links)} link(s) down"
    )


def toxic_on(run: ScenarioRun, kind: str, links: list[str], spec: dict[str, Any]) -> LinkFault:
    """One toxic on each named proxy."""
    name = f"scenario_{kind}"
    record = FaultRecord(kind, ", ".join(links), 0.0, 0.0, affects=ALL)
    return LinkFault(
        run,
        record,
        lambda p: p.add_toxic(name=name, **spec),
        lambda p: p.destroy_toxic(name),
        f"{spec['type']} {spec['attributes']}",
    )


async def wait_for_failing_rows(world: World, timeout: float) -> int:
    """Poll until some unpublished row has failed an attempt (or ``timeout``); how many."""
    deadline, failing = time.monotonic() + timeout, 0
    while True:
        failing = 0
        for context, spec in sorted(world.topo.contexts.items()):
            if spec.stream is None:
                continue
            failing += await db.fetchval(
                world.direct_dsn(context),
                "SELECT count(*) FROM outbox_events"
                " WHERE published_at IS NULL AND publish_attempts > 0",
            )
        if failing or time.monotonic() >= deadline:
            return int(failing)
        await asyncio.sleep(0.5)


async def fast_forward(run: ScenarioRun) -> int:
    """Compress time: every failing row gets the attempts a 40-minute outage leaves."""
    world, timeline, faults = run.world, run.timeline, run.faults
    record = FaultRecord("outbox_fast_forward", "every context", 0.0, time.time())
    moved = 0
    for context, spec in sorted(world.topo.contexts.items()):
        if spec.stream is None:
            continue
        status = await db.execute(
            world.direct_dsn(context),
            "UPDATE outbox_events SET publish_attempts = publish_attempts + $1"
            " WHERE published_at IS NULL AND publish_attempts > 0",
            FAST_FORWARD_ATTEMPTS,
        )
        moved += int(status.split()[-1])
    record.detail = f"{moved} failing rows +{FAST_FORWARD_ATTEMPTS} attempts"
    _close(record, timeline, faults, lasting=False)
    faults["rows fast-forwarded"] += moved
    return moved


async def operator_republish(run: ScenarioRun) -> int:
    """``ferry outbox republish`` (as an operator) of every row set aside PUBLISH_REFUSED."""
    world, timeline, faults = run.world, run.timeline, run.faults
    total = 0
    for context, spec in sorted(world.topo.contexts.items()):
        rows = await read_outbox(world.direct_dsn(context)) if spec.stream else {}
        ids = [i for i, r in rows.items() if r["set_aside"] and r["reason"] == REFUSED]
        if not ids:
            continue
        argv = [sys.executable, "-m", "shared.cli", "outbox", "republish", "--context", context]
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
