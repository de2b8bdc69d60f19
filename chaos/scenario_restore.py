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

The count: the scenario invariants (:mod:`chaos.scenario_accounting`: nothing stuck or
lost among the events the databases know of, no effect applied twice, no unexpected exit)
over the ledger with the forgotten events marked ``forgotten``; besides, no event
committed before the backup missing from the restored database, every event the restore
forgot on the consuming side settled again, and the rewind done. The table gives events
before and after the backup, forgotten ones, duplicates caught by the window and by the
inboxes, and the rewind's selected and published counts and rate.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from chaos.accounting import read_stream
from chaos.roles import ROOT, Role
from chaos.scenario_accounting import Settled, read_inbox, read_outbox
from chaos.scenarios import ScenarioRun, _sleep_until
from chaos.workload import Intent, Producer
from chaos.world import Tuning
from devstack.postgres import install_dir
from shared.adapters.nats import connect_nats
from shared.adapters.postgres import migrate_database
from shared.contracts.lint import redelivery_horizon
from shared.contracts.topology import DurableSpec

#: The context whose database is backed up and restored.
RESTORED = "sea"
#: Fractions of the workload's duration at which the backup and the restore happen.
BACKUP_AT, RESTORE_AT = 0.45, 0.75
#: Seconds the restored context's publisher is held before the backup (unpublished rows).
PUBLISHER_HOLD = 3.0
#: Seconds of consumer lag allowed for, beyond the redelivery horizon, in the margin.
LAG_ALLOWANCE = 2.0
#: Short durable clocks: an event settles (processed or dead-lettered) within seconds, so
#: the margin (the redelivery horizon) stays short. Transient events fail 1-3 times (< 4).
CLOCKS: dict[str, Any] = {
    "ack_wait": "3s",
    "max_deliver": 4,
    "backoff": ["200ms", "500ms", "1s"],
    "replay": "operator",
}
HANDLER_TIMEOUT = "2s"
#: Final inbox statuses (the event settled).
FINAL = ("processed", "failed")


class PausableProducer(Producer):
    """A producer whose transactions wait while :attr:`paused` is held (the application
    stopped for the restore); a transaction in flight finishes first."""

    def __init__(self, context: str, dsn: str, intents: list[Intent], ledger: Any) -> None:
        super().__init__(context, dsn, intents, ledger)
        self.paused = asyncio.Lock()

    async def _commit(self, conn: asyncpg.Connection, batch: list[Intent]) -> bool:
        async with self.paused:
            if conn.is_closed():  # the restore ended its session: reconnect, then commit
                return False
            return await super()._commit(conn, batch)


@dataclass
class Drill:
    """What the backup, the restore and the rewind did, and what they left."""

    backup_at: float = 0.0
    backup_seconds: float = 0.0
    backup_bytes: int = 0
    restore_at: float = 0.0
    restore_seconds: float = 0.0
    #: Producing side: ids of the restored context by where the restore left them.
    kept: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)
    forgotten_published: set[str] = field(default_factory=set)
    republished: set[str] = field(default_factory=set)
    unpublished_kept: set[str] = field(default_factory=set)
    #: Committed before the backup began, absent from the restored database (must be none).
    missing: list[str] = field(default_factory=list)
    #: Consuming side, per durable targeting the restored context.
    settled_kept: dict[str, set[str]] = field(default_factory=dict)
    settled_forgotten: dict[str, set[str]] = field(default_factory=dict)
    effects_forgotten: dict[str, int] = field(default_factory=dict)
    inbox_duplicates_before: dict[str, int] = field(default_factory=dict)
    #: Downstream durables (reading the restored context's stream): duplicates per id of
    #: the re-published rows, before the restore.
    downstream_duplicates_before: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per rewound durable: since (ISO), margin, and the command's JSON (or its error).
    rewinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    rewind_errors: list[str] = field(default_factory=list)


def restore_tuning() -> Tuning:
    """The sea-vibespro world with short durable clocks (see :data:`CLOCKS`)."""
    return Tuning(clocks=dict(CLOCKS), handler_timeout=HANDLER_TIMEOUT)


def margin_of(durable: DurableSpec) -> float:
    """Seconds before the backup a rewind of ``durable`` starts: an event published that
    long before it may have settled after it (its redelivery horizon, plus lag)."""
    return float(math.ceil(redelivery_horizon(durable) + LAG_ALLOWANCE))


class RestoreRun(ScenarioRun):
    """The restore drill (see the module docstring)."""

    def __init__(self, config: Any, scenario: str = "restore", size_name: str = "ci") -> None:
        super().__init__(config, scenario, size_name)
        self.drill = Drill()
        self.dump = config.run_dir / f"{RESTORED}.dump"
        self.paused: dict[str, PausableProducer] = {}

    def tuning(self) -> Tuning:
        """See :func:`restore_tuning`."""
        return restore_tuning()

    @property
    def consuming(self) -> list[str]:
        """Durables targeting the restored context (rewound after the restore)."""
        return sorted(n for n, d in self.world.topo.durables.items() if d.target == RESTORED)

    @property
    def downstream(self) -> list[str]:
        """Durables reading the restored context's stream."""
        stream = self.world.topo.contexts[RESTORED].stream
        assert stream is not None
        return sorted(n for n, d in self.world.topo.durables.items() if d.stream == stream.name)

    def _producer(self, context: str, intents: list[Intent]) -> Producer:
        producer = PausableProducer(context, self.world.direct_dsn(context), intents, self.ledger)
        self.paused[context] = producer
        return producer

    # -- the drill ----------------------------------------------------------------------

    async def _during_play(self, begin: float) -> None:
        seconds = self.size.seconds
        nc = await connect_nats(
            [self.world.nats_server().url], name="chaos-restore", give_up_after=30
        )
        try:
            await _sleep_until(begin + BACKUP_AT * seconds - PUBLISHER_HOLD)
            await self._backup()
            await _sleep_until(begin + RESTORE_AT * seconds)
            await self._restore(nc)
            for durable in self.consuming:
                await self._rewind(durable)
        finally:
            await nc.close()

    async def _backup(self) -> None:
        """Hold the publisher a moment, take the backup, let the publisher go."""
        publisher = self.world.roles[f"publisher-{RESTORED}"]
        await asyncio.to_thread(publisher.stop)
        self.faults[f"publisher-{RESTORED} held before the backup (s)"] += int(PUBLISHER_HOLD)
        await asyncio.sleep(PUBLISHER_HOLD)
        self.drill.backup_at = time.time()
        await _pg_tool("pg_dump", "-Fc", "--file", str(self.dump), "--dbname", self._dsn(RESTORED))
        self.drill.backup_seconds = time.time() - self.drill.backup_at
        self.drill.backup_bytes = self.dump.stat().st_size
        publisher.start()
        self.faults["backup (pg_dump -Fc)"] += 1
        self.timeline.note(
            f"backup of {RESTORED} at t+{self.drill.backup_at - self.timeline.origin:.1f}s"
            f" ({self.drill.backup_bytes:,} bytes, {self.drill.backup_seconds:.1f}s)"
        )

    def _dsn(self, context: str) -> str:
        return self.world.direct_dsn(context)

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
            await _pg_tool("pg_restore", "--exit-on-error", "--dbname", self._dsn(RESTORED),
                           str(self.dump))  # fmt: skip
            await migrate_database(self._dsn(RESTORED), create=False)
            await self._producing_side(nc)
            await self._consuming_side(before)
            for role in roles:
                role.start()
        drill.restore_seconds = time.time() - drill.restore_at
        self.faults["restore (drop, create, pg_restore)"] += 1
        self.faults["roles stopped for the restore"] += len(roles)
        self.timeline.note(
            f"restore of {RESTORED} at t+{drill.restore_at - self.timeline.origin:.1f}s"
            f" ({drill.restore_seconds:.1f}s): {len(drill.forgotten)} events forgotten"
        )

    async def _consuming_state(self) -> dict[str, tuple[set[str], set[str]]]:
        """Per durable targeting the restored context: (settled ids, applied ids)."""
        out = {}
        for durable in self.consuming:
            statuses, _, _ = await read_inbox(self._dsn(RESTORED), durable)
            applied = await _fetch_ids(
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
            for i in self.ledger.intents.values()
            if i.context == RESTORED and i.status in ("committed", "uncertain", "pending")
        ]
        drill.kept = {i.id for i in mine if i.id in restored}
        forgotten = [i for i in mine if i.id not in restored]
        drill.forgotten = {i.id for i in forgotten}
        drill.forgotten_published = drill.forgotten & in_stream
        drill.missing = sorted(
            i.id for i in forgotten if i.committed_at and i.committed_at < drill.backup_at
        )
        self.ledger.mark(forgotten, "forgotten")
        pending = {i for i, r in restored.items() if not r["published"]}
        drill.republished = pending & in_stream
        drill.unpublished_kept = pending - in_stream
        for durable in self.downstream:
            target = self.world.topo.durables[durable].target
            drill.downstream_duplicates_before[durable] = await _duplicates(
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
            _, _, dupes = await read_inbox(self._dsn(RESTORED), durable)
            drill.inbox_duplicates_before[durable] = dupes

    async def _rewind(self, durable: str) -> None:
        """``ferry durable rewind --since (backup - margin)`` as an operator runs it."""
        margin = margin_of(self.world.topo.durables[durable])
        since = datetime.fromtimestamp(self.drill.backup_at - margin, UTC)
        argv = [sys.executable, "-m", "shared.ops.cli", "durable", "rewind", "--durable", durable]
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
        self.faults["rewind (ferry durable rewind)"] += 1
        self.timeline.note(
            f"rewind of {durable} since {since.isoformat()}: {doc['result'].get('published')}"
            f" of {doc['result'].get('selected')} re-delivered"
        )

    # -- the count ----------------------------------------------------------------------

    async def _count_more(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        drill, topo, violations = self.drill, self.world.topo, list(self.drill.rewind_errors)
        origin = self.timeline.origin
        stream = topo.contexts[RESTORED].stream
        assert stream is not None and self.nc is not None
        copies = Counter(i for i, _ in await read_stream(self.nc.jetstream(), stream.name))
        by_window = {i for i in drill.republished if copies[i] == 1}
        by_inbox = {i for i in drill.republished if copies[i] > 1}
        downstream_dupes = 0
        for durable in self.downstream:
            now = await _duplicates(
                self._dsn(topo.durables[durable].target), durable, drill.republished
            )
            before = drill.downstream_duplicates_before.get(durable, {})
            downstream_dupes += sum(n - before.get(i, 0) for i, n in now.items())
        downstream: dict[str, str] = {}
        for durable in self.downstream:
            statuses, _, _ = await read_inbox(self._dsn(topo.durables[durable].target), durable)
            downstream.update((i, statuses[i]) for i in drill.forgotten if i in statuses)
        reached = sum(1 for i in drill.forgotten_published if downstream.get(i) in FINAL)
        self._list_forgotten(downstream)
        after = {i.id for i in self.ledger.intents.values()
                 if i.context == RESTORED and i.status == "committed"} - drill.kept  # fmt: skip
        table: dict[str, Any] = {
            "restored context": RESTORED,
            "backup at (s into the run)": round(drill.backup_at - origin, 1),
            "backup size (bytes), seconds": f"{drill.backup_bytes:,}, {drill.backup_seconds:.1f}",
            "restore at (s into the run)": round(drill.restore_at - origin, 1),
            "restore took (s, roles down)": round(drill.restore_seconds, 1),
            f"{RESTORED} events before the backup (kept)": len(drill.kept),
            f"{RESTORED} events after the backup (forgotten)": len(drill.forgotten),
            "  forgotten, listed in": "forgotten.json",
            "  forgotten, already published": len(drill.forgotten_published),
            "  forgotten, processed downstream anyway": reached,
            f"{RESTORED} events after the restore": len(after),
            "before the backup, missing after the restore": len(drill.missing),
            "unpublished at the backup, published after": len(drill.republished),
            "  caught by the duplicate window": len(by_window),
            "  caught by the downstream inbox": len(by_inbox),
            "  duplicates the downstream inboxes counted": downstream_dupes,
            "unpublished at the backup, published later": len(drill.unpublished_kept),
        }
        if drill.missing:
            violations.append(
                f"committed before the backup, missing from the restored database:"
                f" {len(drill.missing)} ({', '.join(drill.missing[:4])})"
            )
        if by_inbox and downstream_dupes < len(by_inbox):
            violations.append(
                f"re-published outside the duplicate window: {len(by_inbox)}, but the"
                f" downstream inboxes counted only {downstream_dupes} duplicates"
            )
        for durable in self.consuming:
            await self._count_consuming(durable, settled, table, violations)
        return table, violations

    def _list_forgotten(self, downstream: dict[str, str]) -> None:
        """``forgotten.json``: each event the restore forgot, when it was committed (seconds
        into the run), whether it had been published, its downstream inbox status."""
        forgotten = [self.ledger.intents[i] for i in self.drill.forgotten]
        doc = [
            {
                "id": i.id,
                "event": f"{i.event_type}.v{i.version}",
                "class": i.klass,
                "committed": round((i.committed_at or 0.0) - self.timeline.origin, 3),
                "published": i.id in self.drill.forgotten_published,
                "downstream": downstream.get(i.id),
            }
            for i in sorted(forgotten, key=lambda i: i.committed_at or 0.0)
        ]
        (self.config.run_dir / "forgotten.json").write_text(json.dumps(doc, indent=1) + "\n")

    async def _count_consuming(
        self, durable: str, settled: Settled, table: dict[str, Any], violations: list[str]
    ) -> None:
        drill = self.drill
        statuses, _, dupes = await read_inbox(self._dsn(RESTORED), durable)
        forgotten = drill.settled_forgotten.get(durable, set())
        unsettled = sorted(i for i in forgotten if statuses.get(i) not in FINAL)
        twice = [e for e in settled.effects_twice if e.split(" ")[0] in forgotten]
        doc = drill.rewinds.get(durable, {})
        result = doc.get("result", {})
        table[f"{durable}: settled before the backup (kept)"] = len(
            drill.settled_kept.get(durable, ())
        )
        table[f"{durable}: settled after it (forgotten)"] = len(forgotten)
        table[f"{durable}: effects forgotten by the restore"] = drill.effects_forgotten.get(
            durable, 0
        )
        table[f"{durable}: forgotten, settled again"] = len(forgotten) - len(unsettled)
        table[f"{durable}: lost"] = len(unsettled)
        table[f"{durable}: effects applied twice"] = len(twice)
        caught = dupes - drill.inbox_duplicates_before.get(durable, 0)
        table[f"{durable}: duplicates caught by the inbox"] = caught
        table[f"{durable}: rewind since (margin s)"] = (
            f"{doc.get('since', '-')} ({doc.get('margin', '-')})"
        )
        table[f"{durable}: rewind selected, published"] = (
            f"{result.get('selected', '-')}, {result.get('published', '-')}"
        )
        table[f"{durable}: rewind seconds, rate (msg/s)"] = (
            f"{result.get('seconds', '-')}, {result.get('rate', '-')}"
        )
        if not result:
            violations.append(f"{durable}: the rewind did not run (see the notes)")
        elif result.get("published") != result.get("selected", 0) - result.get("skipped", 0):
            violations.append(f"{durable}: the rewind published {result.get('published')} of"
                              f" {result.get('selected')} selected")  # fmt: skip
        if unsettled:
            violations.append(
                f"{durable}: settled after the backup, not again after the rewind:"
                f" {len(unsettled)} ({', '.join(unsettled[:4])})"
            )


async def _pg_tool(name: str, *args: str) -> None:
    """Run one of the wheel's PostgreSQL client programs; raise with its stderr if it fails."""
    argv = [str(install_dir() / "bin" / name), *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr.strip()[-500:]}")


async def _fetch_ids(dsn: str, query: str, *args: Any) -> set[str]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return {r["id"] for r in await conn.fetch(query, *args)}
    finally:
        await conn.close()


async def _duplicates(dsn: str, durable: str, ids: set[str]) -> dict[str, int]:
    """Duplicates the inbox of ``durable`` counted on each of ``ids`` (that it has)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT message_id::text AS id, duplicates FROM inbox_messages"
            " WHERE durable = $1 AND message_id = ANY($2::uuid[])",
            durable,
            sorted(ids),
        )
    finally:
        await conn.close()
    return {r["id"]: int(r["duplicates"] or 0) for r in rows}
