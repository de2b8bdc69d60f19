"""The ``restore`` scenario: a restore drill of one context's database (issue 26).

``python -m chaos.run --scenario restore [--schedule soak | --events N --seconds S]``

While the workload runs, the database of context :data:`RESTORED` (``sea``) is backed up
with ``pg_dump -Fc``; the run goes on; later it is restored from that backup as the
restore page says (its publisher, the consumers of the durables targeting it, its handler
service and the dlq-router stopped; the database dropped, created again and
``pg_restore``\\ d; ``ferry migrate``'s function; the roles started again), so it forgets
everything after the backup. Its producer (the application writing its outbox) is paused
meanwhile. Then the operator rewinds each durable targeting it with
``ferry durable rewind --since (backup time - margin)`` (the command itself), the margin
being the durable's redelivery horizon plus :data:`LAG_ALLOWANCE`, and lets the restored
outbox publish again what it holds.

A restored database is both sides at once:

* **consuming** (the target of ``sea__from_vibespro``): its inbox and the handler's
  effects lose what was settled after the backup; the rewind re-delivers it, the inbox
  counts what the backup still knew as duplicates, the rest is processed again;
* **producing** (the source of ``vibespro__from_sea``): its outbox loses the rows
  committed after the backup (*forgotten*, as the state they described; those already
  published reached the consumer anyway: counted apart), and rows that were unpublished
  at the backup but published before the restore are published again by the restored
  outbox: the stream's duplicate window drops a copy inside it (the id stays once in the
  stream), the downstream inbox counts one outside it. To give the backup unpublished
  rows, the publisher is held :data:`PUBLISHER_HOLD` seconds before it.

The count: the scenario invariants (:mod:`chaos.engine.settled`: nothing stuck or
lost among the events the databases know of, no effect applied twice, no unexpected exit)
over the ledger with the forgotten events marked ``forgotten``; besides, no event
committed before the backup missing from the restored database, every event the restore
forgot on the consuming side settled again, and the rewind done. The table gives events
before and after the backup, forgotten ones, duplicates caught by the window and by the
inboxes, and the rewind's selected and published counts and rate.

The pieces live in sibling modules: :mod:`chaos.scenarios.restore.setup` (the settings, the
paused producer, the :class:`Drill` record), :mod:`chaos.scenarios.restore.db` (pg_dump,
pg_restore and the database reads), :mod:`chaos.scenarios.restore.count` (the count);
this module runs the drill (:class:`Restore`, the scenario's play).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from chaos.engine.accounting import read_stream
from chaos.engine.config import RunConfig, Size
from chaos.engine.engine import sleep_until
from chaos.engine.roles import ROOT, Role
from chaos.engine.scenario import Play, ScenarioRun
from chaos.engine.settled import Settled, read_inbox, read_outbox
from chaos.engine.tuning import Tuning
from chaos.engine.workload import Intent, Producer
from chaos.scenarios.restore.count import RestoreCount
from chaos.scenarios.restore.db import duplicates, fetch_ids, pg_tool
from chaos.scenarios.restore.setup import (
    BACKUP_AT,
    FINAL,
    PUBLISHER_HOLD,
    RESTORE_AT,
    RESTORED,
    Drill,
    PausableProducer,
    consuming,
    downstream,
    margin_of,
    restore_tuning,
)
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import migrate_database


class Restore(Play):
    """The restore drill (see the module docstring)."""

    sizes = {"ci": Size(45.0, 450, 120.0), "soak": Size(600.0, 12_000, 400.0)}

    def __init__(self, run: ScenarioRun) -> None:
        super().__init__(run)
        self.world, self.timeline = run.world, run.timeline
        self.drill = Drill()
        self.dump = run.config.run_dir / f"{RESTORED}.dump"
        self.paused: dict[str, PausableProducer] = {}

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """See :func:`restore_tuning`."""
        return restore_tuning()

    def producer(self, context: str, intents: list[Intent]) -> Producer:
        """A producer the restore can pause."""
        producer = PausableProducer(
            context, self.world.direct_dsn(context), intents, self.run.ledger
        )
        self.paused[context] = producer
        return producer

    @property
    def consuming(self) -> list[str]:
        """Durables targeting the restored context (rewound after the restore)."""
        return consuming(self.world)

    @property
    def downstream(self) -> list[str]:
        """Durables reading the restored context's stream."""
        return downstream(self.world)

    def _dsn(self, context: str) -> str:
        return self.world.direct_dsn(context)

    async def count_more(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        """See :class:`~chaos.scenarios.restore.count.RestoreCount`."""
        return await RestoreCount(self.run, self.drill).count(settled)

    # -- the drill ----------------------------------------------------------------------

    async def during(self, begin: float) -> None:
        """Backup, restore, rewind (see the module docstring)."""
        seconds = self.run.size.seconds
        nc = await connect_nats(
            [self.world.nats_server().url], name="chaos-restore", give_up_after=30
        )
        try:
            await sleep_until(begin + BACKUP_AT * seconds - PUBLISHER_HOLD)
            await self._backup()
            await sleep_until(begin + RESTORE_AT * seconds)
            await self._restore(nc)
            for durable in self.consuming:
                await self._rewind(durable)
        finally:
            await nc.close()

    async def _backup(self) -> None:
        """Hold the publisher a moment, take the backup, let the publisher go."""
        publisher = self.world.roles[f"publisher-{RESTORED}"]
        await asyncio.to_thread(publisher.stop)
        self.run.faults[f"publisher-{RESTORED} held before the backup (s)"] += int(PUBLISHER_HOLD)
        await asyncio.sleep(PUBLISHER_HOLD)
        self.drill.backup_at = time.time()
        await pg_tool("pg_dump", "-Fc", "--file", str(self.dump), "--dbname", self._dsn(RESTORED))
        self.drill.backup_seconds = time.time() - self.drill.backup_at
        self.drill.backup_bytes = self.dump.stat().st_size
        publisher.start()
        self.run.faults["backup (pg_dump -Fc)"] += 1
        self.timeline.note(
            f"backup of {RESTORED} at t+{self.drill.backup_at - self.timeline.origin:.1f}s"
            f" ({self.drill.backup_bytes:,} bytes, {self.drill.backup_seconds:.1f}s)"
        )

    def _roles_of_restore(self) -> list[Role]:
        """What uses the restored database: its publisher, the consumers of durables
        targeting it, its handler service, the dlq-router."""
        names = {f"publisher-{RESTORED}", f"handler-{RESTORED}", "dlq-router"}
        roles = [r for r in self.world.roles.values() if r.name in names]
        for durable in self.consuming:
            roles += [r for r in self.world.consumer_replicas(durable) if not r.held_down]
        return roles

    async def _restore(self, nc: NATS) -> None:
        """Stop, drop, create, pg_restore, migrate, look, start again (producer paused)."""
        drill = self.drill
        drill.restore_at = time.time()
        producer = self.paused[RESTORED]
        roles = self._roles_of_restore()
        async with producer.paused:
            await asyncio.gather(*(asyncio.to_thread(r.stop) for r in roles))
            before = await self._consuming_state()
            admin = await asyncpg.connect(self.world.postgres().dsn(), timeout=10)
            try:
                database = self.world.topo.context(RESTORED).database
                await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
                await admin.execute(f'CREATE DATABASE "{database}"')
            finally:
                await admin.close()
            await pg_tool("pg_restore", "--exit-on-error", "--dbname", self._dsn(RESTORED),
                           str(self.dump))  # fmt: skip
            await migrate_database(self._dsn(RESTORED), create=False)
            await self._producing_side(nc)
            await self._consuming_side(before)
            for role in roles:
                role.start()
        drill.restore_seconds = time.time() - drill.restore_at
        self.run.faults["restore (drop, create, pg_restore)"] += 1
        self.run.faults["roles stopped for the restore"] += len(roles)
        self.timeline.note(
            f"restore of {RESTORED} at t+{drill.restore_at - self.timeline.origin:.1f}s"
            f" ({drill.restore_seconds:.1f}s): {len(drill.forgotten)} events forgotten"
        )

    async def _consuming_state(self) -> dict[str, tuple[set[str], set[str]]]:
        """Per durable targeting the restored context: (settled ids, applied ids)."""
        out = {}
        for durable in self.consuming:
            statuses, _, _ = await read_inbox(self._dsn(RESTORED), durable)
            applied = await fetch_ids(
                self._dsn(RESTORED),
                "SELECT message_id::text AS id FROM handler_applied WHERE handler = $1",
                self.world.topo.durables[durable].target,
            )
            out[durable] = ({i for i, s in statuses.items() if s in FINAL}, applied)
        return out

    async def _producing_side(self, nc: NATS) -> None:
        """What the restored outbox kept and forgot; mark the forgotten in the ledger."""
        drill = self.drill
        stream = self.world.topo.contexts[RESTORED].stream
        assert stream is not None
        restored = await read_outbox(self._dsn(RESTORED))
        in_stream = {msg_id for msg_id, _ in await read_stream(nc.jetstream(), stream.name)}
        mine = [
            i
            for i in self.run.ledger.intents.values()
            if i.context == RESTORED and i.status in ("committed", "uncertain", "pending")
        ]
        drill.kept = {i.id for i in mine if i.id in restored}
        forgotten = [i for i in mine if i.id not in restored]
        drill.forgotten = {i.id for i in forgotten}
        drill.forgotten_published = drill.forgotten & in_stream
        drill.missing = sorted(
            i.id for i in forgotten if i.committed_at and i.committed_at < drill.backup_at
        )
        self.run.ledger.mark(forgotten, "forgotten")
        pending = {i for i, r in restored.items() if not r["published"]}
        drill.republished = pending & in_stream
        drill.unpublished_kept = pending - in_stream
        for durable in self.downstream:
            target = self.world.topo.durables[durable].target
            drill.downstream_duplicates_before[durable] = await duplicates(
                self._dsn(target), durable, drill.republished
            )

    async def _consuming_side(self, before: dict[str, tuple[set[str], set[str]]]) -> None:
        """What the restored inbox and effects forgot, per durable targeting the context."""
        drill = self.drill
        after = await self._consuming_state()
        for durable, (settled, applied) in before.items():
            kept_settled, kept_applied = after[durable]
            drill.settled_kept[durable] = kept_settled
            drill.settled_forgotten[durable] = settled - kept_settled
            drill.effects_forgotten[durable] = len(applied - kept_applied)
            statuses, _, dupes = await read_inbox(self._dsn(RESTORED), durable)
            drill.inbox_duplicates_before[durable] = dupes
            processed = {i for i in kept_settled if statuses.get(i) == "processed"}
            drill.processed_duplicates_before[durable] = await duplicates(
                self._dsn(RESTORED), durable, processed
            )

    async def _rewind(self, durable: str) -> None:
        """``ferry durable rewind --since (backup - margin)`` as an operator runs it."""
        margin = margin_of(self.world.topo.durables[durable])
        since = datetime.fromtimestamp(self.drill.backup_at - margin, UTC)
        argv = [sys.executable, "-m", "shared.cli", "durable", "rewind", "--durable", durable]
        argv += ["--since", since.isoformat(timespec="milliseconds"), "--json"]
        argv += ["--reason", f"restore drill: {RESTORED} restored from its backup"]
        argv += ["--actor", "chaos-operator"]
        doc: dict[str, Any] = {"since": since.isoformat(), "margin": margin}
        self.drill.rewinds[durable] = doc
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=ROOT, env=self.world.operator_env(),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        out = done.stdout.strip()
        if done.returncode != 0 or not out.startswith("{"):
            said = " | ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
            self.drill.rewind_errors.append(
                f"ferry durable rewind --durable {durable} exited {done.returncode}: {said}"
            )
            return
        doc["result"] = json.loads(out)
        self.run.faults["rewind (ferry durable rewind)"] += 1
        self.timeline.note(
            f"rewind of {durable} since {since.isoformat()}: {doc['result'].get('published')}"
            f" of {doc['result'].get('selected')} re-delivered"
        )
