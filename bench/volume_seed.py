"""A year in the life of one lane (issue 48): history seeded into a context's databases
with set-based SQL, so that every hot query can be measured and EXPLAINed at volume.

The lane is a durable of a topology: its source context's database gets the outbox, its
target's database the inbox, the dead letters with their actions, the parked events
behind held heads and the handler's claims (``handler_applied`` / ``handler_calls``,
created with the SDK's own DDL). Rows look like what the roles write: statuses,
timestamps spread over the year that ends :data:`HISTORY_ENDS` ago (in the order the
roles write them), the durable, the stream, subjects and event types the registry
declares for the source context.

Ids tie the tables together as they are in production: history event ``g`` has the id
``md5('e' || g)``, its outbox row (``g`` up to the outbox size), its inbox row, its dead
letter (every :attr:`Sizes.dead_every` th event; its inbox row 'failed') and its claim.

Each table is filled by one ``INSERT ... SELECT FROM generate_series`` with its indexes
dropped, which are then rebuilt (a sorted build: minutes less than a year of random
inserts into b-trees), and finally vacuumed and analyzed, as autovacuum would have left
it. Sizes are :class:`Sizes` (the issue's, times a factor); each table says its rows per
second as it goes.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import asyncpg

from shared.adapters import outbox_set_aside
from shared.contracts.events import declared_events
from shared.contracts.topology import Topology
from shared.sdk.store import BOOKKEEPING_DDL

#: The newest history row is this old: a measurement's own rows (its events occurred
#: after it started) are never confused with history.
HISTORY_ENDS = "10 minutes"
#: Memory of each index rebuild (the seeding session's own).
BUILD_MEMORY = "256MB"
#: The aggregate of the set-aside outbox row and of the rows waiting behind it.
STUCK_AGGREGATE = "vol-stuck"
#: The ordering keys of the parked events (``vol-key-0`` ...).
KEY_PREFIX = "vol-key-"


@dataclass(frozen=True)
class Sizes:
    """How much history (the issue's figures; :meth:`scaled` for CI and smoke runs)."""

    inbox: int = 10_000_000
    outbox: int = 2_000_000
    dead_letters: int = 200_000
    parked: int = 100_000
    held_heads: int = 1_000
    set_aside_behind: int = 50_000
    claims: int = 1_000_000

    def scaled(self, factor: float) -> Sizes:
        """Every size times ``factor`` (at least one row each)."""
        return replace(self, **{f.name: max(1, round(getattr(self, f.name) * factor))
                                for f in fields(self)})  # fmt: skip

    @property
    def dead_every(self) -> int:
        """One history event in this many was dead-lettered."""
        return max(1, self.inbox // max(self.dead_letters, 1))

    def total(self) -> int:
        """Rows seeded in all (dead-letter actions and the set-aside row's audit aside)."""
        return (self.inbox + self.outbox + self.dead_letters + self.parked
                + self.set_aside_behind + 1 + 2 * self.claims)  # fmt: skip


@dataclass(frozen=True)
class Lane:
    """Where the history goes: a durable, its stream, and its two databases."""

    durable: str
    stream: str
    namespace: str
    dlq_subject: str
    event_types: tuple[tuple[str, int], ...]
    source_dsn: str
    target_dsn: str
    #: The handler name of the claims (the target context's example handler).
    handler: str

    @classmethod
    def of(cls, topology: Topology, durable: str, dsn: Callable[[str], str]) -> Lane:
        """The lane of ``durable`` in ``topology``; ``dsn`` gives a context's database."""
        spec = topology.durable(durable)
        source = topology.context_of_stream(spec.stream)
        declared = declared_events(topology.name)
        types = tuple(sorted({(e.type, e.version) for e in declared if e.producer == source}))
        return cls(
            durable=durable, stream=spec.stream,
            namespace=topology.namespace_of_stream(spec.stream),
            dlq_subject=spec.dead_letter_subject or f"{source}.dlq.{durable}",
            event_types=types or (("history_event", 1),),
            source_dsn=dsn(source), target_dsn=dsn(spec.target), handler=spec.target,
        )  # fmt: skip

    def type_sql(self, g: str) -> tuple[str, str, str]:
        """SQL of event ``g``'s type, version and subject (the declared types in turn)."""
        names = ", ".join(f"'{t}'" for t, _ in self.event_types)
        versions = ", ".join(str(v) for _, v in self.event_types)
        pick = f"1 + ({g}) % {len(self.event_types)}"
        kind, version = f"(ARRAY[{names}])[{pick}]", f"(ARRAY[{versions}])[{pick}]"
        subject = f"'{self.namespace}.' || {kind} || '.v' || {version}"
        return kind, version, subject


def _when(g: str, n: int) -> str:
    """Event ``g`` of ``n``: its time, the year up to :data:`HISTORY_ENDS` ago, in order."""
    return (f"(now() - interval '{HISTORY_ENDS}' - interval '365 days'"
            f" + ({g})::float8 / {max(n, 1)} * interval '365 days')")  # fmt: skip


def _event_id(g: str) -> str:
    return f"md5('e' || ({g}))::uuid"


# --------------------------------------------------------------------------- statements


def outbox_sql(lane: Lane, n: int) -> str:
    """The published outbox history: ``n`` events of the source, seq in time order."""
    kind, version, _ = lane.type_sql("g")
    at = _when("g", n)
    return f"""
INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload,
                           occurred_at, recorded_at, published_at, publish_attempts,
                           last_attempt_at, traceparent)
SELECT {_event_id("g")}, 'model', 'm' || g % 1000, {kind}, {version},
       jsonb_build_object('model_id', 'm' || g % 1000, 'name', 'model ' || g),
       t.at, t.at, t.at + interval '20 ms', 1, t.at + interval '20 ms',
       CASE WHEN g % 10 = 0 THEN '00-' || md5('t' || g) || '-' || left(md5('s' || g), 16)
            || '-01' END
FROM generate_series(1, {n}) g, LATERAL (SELECT {at} AS at) t
ORDER BY g
"""


def set_aside_sql(lane: Lane, behind: int) -> str:
    """A row set aside two days ago, ``behind`` events of its aggregate waiting after it."""
    kind, version, _ = lane.type_sql("0")
    return f"""
WITH stuck AS (
  INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,
                             payload, occurred_at, recorded_at, publish_attempts,
                             publish_error, last_attempt_at, set_aside_at, set_aside_reason)
  VALUES (md5('stuck')::uuid, 'model', '{STUCK_AGGREGATE}', {kind}, {version},
          '{{"model_id": "{STUCK_AGGREGATE}", "name": "too large"}}'::jsonb,
          now() - interval '2 days', now() - interval '2 days', 5,
          'PubAck refused: maximum payload exceeded', now() - interval '2 days',
          now() - interval '2 days', 'PUBLISH_REFUSED')
  RETURNING id, seq
), audit AS (
  INSERT INTO outbox_actions (event_id, seq, action, actor, reason, at, details)
  SELECT id, seq, 'set_aside', 'outbox-publisher', 'PUBLISH_REFUSED', now() - interval '2 days',
         '{{"attempts": 5}}'::jsonb FROM stuck
)
INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version, payload,
                           occurred_at, recorded_at)
SELECT md5('behind' || g)::uuid, 'model', '{STUCK_AGGREGATE}', {kind}, {version},
       jsonb_build_object('model_id', '{STUCK_AGGREGATE}', 'name', 'waiting ' || g),
       now() - interval '2 days' + g * interval '1 second',
       now() - interval '2 days' + g * interval '1 second'
FROM stuck, generate_series(1, {behind}) g
ORDER BY g
"""


def inbox_sql(lane: Lane, sizes: Sizes) -> str:
    """The durable's inbox: every event processed but one in ``dead_every``, dead-lettered:
    'failed', or processed an hour later when its dead letter was replayed."""
    kind, version, subject = lane.type_sql("g")
    at, every = _when("g", sizes.inbox), sizes.dead_every
    replayed = _REPLAYED.format(d=f"g / {every}", dead_letters=sizes.dead_letters)
    return f"""
INSERT INTO inbox_messages (message_id, durable, subject, received_at, processed_at, attempts,
                            status, event_type, event_version, occurred_at, stream_seq,
                            handler_status, reason_code, last_error, dlq_metadata, updated_at)
SELECT {_event_id("g")}, '{lane.durable}', {subject}, t.at + interval '30 ms',
       CASE WHEN NOT t.dead THEN t.at + interval '45 ms'
            WHEN t.replayed THEN t.at + interval '1 hour' END,
       CASE WHEN t.dead THEN 6 ELSE 1 END,
       CASE WHEN t.dead AND NOT t.replayed THEN 'failed' ELSE 'processed' END, {kind},
       {version}, t.at, g, CASE WHEN t.dead AND NOT t.replayed THEN 422 ELSE 200 END,
       CASE WHEN t.dead THEN (CASE WHEN t.replayed THEN 'REPLAY' ELSE 'HANDLER_REJECTED' END) END,
       CASE WHEN t.dead AND NOT t.replayed THEN 'rejected: order ' || g || ' has no model' END,
       CASE WHEN t.replayed THEN '{{"status": "replayed"}}'::jsonb
            WHEN t.dead THEN '{{"status": "dead_lettered"}}'::jsonb END,
       t.at + CASE WHEN t.replayed THEN interval '1 hour' ELSE interval '45 ms' END
FROM generate_series(1, {sizes.inbox}) g,
     LATERAL (SELECT {at} AS at, g % {every} = 0 AS dead,
                     g % {every} = 0 AND {replayed} AS replayed) t
ORDER BY g
"""


#: Whether dead letter ``d`` was replayed (and its event processed): see _DEAD_STATUS.
_REPLAYED = "(({d}) % 100 BETWEEN 4 AND 69 AND ({d}) <= {dead_letters})"


#: Dead-letter status by ``d % 100``: 4 % still open (held, parked, dead), the rest settled.
_DEAD_STATUS = ("CASE WHEN d % 100 < 2 THEN 'held' WHEN d % 100 = 2 THEN 'parked'"
                " WHEN d % 100 = 3 THEN 'dead' WHEN d % 100 < 70 THEN 'replayed'"
                " ELSE 'discarded' END")  # fmt: skip


def dead_letters_sql(lane: Lane, sizes: Sizes) -> str:
    """The durable's dead letters: event ``d * dead_every`` each, most of them settled."""
    g = f"d * {sizes.dead_every}"
    kind, version, subject = lane.type_sql(g)
    at = _when(g, sizes.inbox)
    return f"""
INSERT INTO dead_letters (durable, message_id, stream, stream_seq, original_subject, event_type,
                          event_version, reason_code, last_error, attempts, record, dlq_subject,
                          source, first_dead_lettered_at, dead_lettered_at, status,
                          replay_attempts, next_replay_at, replayed_at, updated_at)
SELECT '{lane.durable}', {_event_id(g)}, '{lane.stream}', {g}, {subject}, {kind}, {version},
       (ARRAY['HANDLER_REJECTED', 'MAX_DELIVERIES_EXCEEDED', 'SCHEMA_INVALID'])[1 + d % 3],
       'rejected: order ' || {g} || ' has no model', 5,
       jsonb_build_object('payload', jsonb_build_object('model_id', 'm' || d % 1000),
                          'subject', {subject}, 'event_type', {kind}),
       '{lane.dlq_subject}', 'consumer', t.at, t.at, t.status,
       CASE WHEN t.status = 'replayed' THEN 1 ELSE 0 END,
       CASE WHEN t.status = 'dead' THEN now() + interval '1 hour' END,
       CASE WHEN t.status = 'replayed' THEN t.at + interval '1 hour' END,
       t.at + interval '1 hour'
FROM generate_series(1, {sizes.dead_letters}) d,
     LATERAL (SELECT {at} + interval '1 second' AS at, {_DEAD_STATUS} AS status) t
ORDER BY d
"""


def dead_letter_actions_sql(lane: Lane) -> str:
    """What settled or parked each dead letter: one action each, an hour after it."""
    return f"""
INSERT INTO dead_letter_actions (durable, message_id, action, actor, reason, at, details)
SELECT durable, message_id,
       CASE status WHEN 'replayed' THEN 'auto_replay' WHEN 'discarded' THEN 'discard'
                   ELSE 'park' END,
       CASE status WHEN 'replayed' THEN 'dlq-replayer' ELSE 'ops' END,
       CASE status WHEN 'replayed' THEN 'automatic replay' ELSE 'seen, not ours to fix' END,
       dead_lettered_at + interval '1 hour', '{{}}'::jsonb
FROM dead_letters WHERE durable = '{lane.durable}' AND status IN ('replayed', 'discarded', 'parked')
ORDER BY dead_lettered_at
"""


def parked_sql(lane: Lane, sizes: Sizes) -> str:
    """``parked`` events over ``held_heads`` keys, each key's head held (its dead letter
    awaits an operator), the rest queued behind it: waiting at 'infinity', as the consumer
    leaves the events behind a held head (migration 0022)."""
    keys = sizes.held_heads
    per_key = max(1, sizes.parked // keys)
    _, _, subject = lane.type_sql("p")
    return f"""
INSERT INTO parked_messages (durable, ordering_key, stream_seq, message_id, delivered_seq,
                             partition, subject, headers, data, state, attempts,
                             next_attempt_at, reason, parked_at, held_head)
SELECT '{lane.durable}', '{KEY_PREFIX}' || k.k, {sizes.inbox} + p, md5('p' || p)::uuid,
       {sizes.inbox} + p, 0, {subject},
       jsonb_build_object('Nats-Msg-Id', md5('p' || p)::uuid::text),
       convert_to(jsonb_build_object('model_id', 'm' || k.k)::text, 'UTF8'),
       CASE WHEN k.head THEN 'held' ELSE 'queued' END, CASE WHEN k.head THEN 5 ELSE 0 END,
       CASE WHEN k.head THEN now() - interval '1 day' + p * interval '1 ms'
            ELSE 'infinity' END,
       CASE WHEN k.head THEN 'HANDLER_REJECTED' ELSE 'BEHIND_HELD' END,
       now() - interval '1 day' + p * interval '1 ms',
       CASE WHEN NOT k.head THEN md5('p' || (k.k + 1))::uuid END
FROM generate_series(1, {keys * per_key}) p,
     LATERAL (SELECT (p - 1) % {keys} AS k, p <= {keys} AS head) k
ORDER BY p
"""


def claims_sql(lane: Lane, sizes: Sizes, table: str) -> str:
    """The handler's claims (``handler_applied``) or calls (``handler_calls``): one per
    processed event, spread evenly over the inbox's year."""
    g = f"(1 + (c - 1) * {max(sizes.inbox // max(sizes.claims, 1), 1)})"
    at = f"{_when(g, sizes.inbox)} + interval '40 ms'"
    if table == "handler_applied":
        return f"""
INSERT INTO handler_applied (message_id, handler, applied_at)
SELECT {_event_id(g)}, '{lane.handler}', {at}
FROM generate_series(1, {sizes.claims}) c ORDER BY c
"""
    return f"""
INSERT INTO handler_calls (message_id, handler, attempt, status, called_at)
SELECT {_event_id(g)}, '{lane.handler}', 1, 200, {at}
FROM generate_series(1, {sizes.claims}) c ORDER BY c
"""


# --------------------------------------------------------------------------- seeding


@dataclass
class Seeded:
    """What was seeded: per table, rows and seconds (index rebuilds included)."""

    tables: dict[str, tuple[int, float]]
    seconds: float

    def rows(self) -> int:
        return sum(rows for rows, _ in self.tables.values())


Say = Callable[[str], None]


async def seed(lane: Lane, sizes: Sizes, say: Say = print) -> Seeded:
    """Fill the lane's databases with ``sizes`` of history; vacuum and analyze them."""
    started = time.monotonic()
    done: dict[str, tuple[int, float]] = {}
    source = await asyncpg.connect(lane.source_dsn)
    target = (
        source if lane.target_dsn == lane.source_dsn else await asyncpg.connect(lane.target_dsn)
    )
    try:
        for conn in {id(source): source, id(target): target}.values():
            await conn.execute(f"SET maintenance_work_mem = '{BUILD_MEMORY}';"
                               " SET synchronous_commit = off")  # fmt: skip
        for ddl in BOOKKEEPING_DDL:  # the handler's tables, as its SDK creates them
            await target.execute(ddl)
        # The last figure: rows inserted beside the statement's count (the set-aside row,
        # inserted by a CTE).
        steps: list[tuple[asyncpg.Connection, str, str, int]] = [
            (source, "outbox_events", outbox_sql(lane, sizes.outbox), 0),
            (source, "outbox_events", set_aside_sql(lane, sizes.set_aside_behind), 1),
            (target, "inbox_messages", inbox_sql(lane, sizes), 0),
            (target, "dead_letters", dead_letters_sql(lane, sizes), 0),
            (target, "dead_letter_actions", dead_letter_actions_sql(lane), 0),
            (target, "parked_messages", parked_sql(lane, sizes), 0),
            (target, "handler_applied", claims_sql(lane, sizes, "handler_applied"), 0),
            (target, "handler_calls", claims_sql(lane, sizes, "handler_calls"), 0),
        ]
        for conn, table, sql, beside in steps:
            rows, seconds = await _fill(conn, table, sql)
            rows += beside
            before = done.get(table, (0, 0.0))
            done[table] = (before[0] + rows, before[1] + seconds)
            say(f"  {table}: {rows:,} rows in {seconds:.1f}s ({rows / max(seconds, 1e-3):,.0f}/s)")
        for conn, tables in ((source, ("outbox_events", "outbox_actions")),
                             (target, tuple(t for _, t, _, _ in steps[2:]))):  # fmt: skip
            began = time.monotonic()
            for table in dict.fromkeys(tables):
                await conn.execute(f"VACUUM (ANALYZE) {table}")
            say(f"  vacuum and analyze {', '.join(dict.fromkeys(tables))}: "
                f"{time.monotonic() - began:.1f}s")  # fmt: skip
        # A publisher ran all along: the rows behind the set-aside row are marked as its
        # sweep marks them (migration 0023), by the same code, on the analyzed table; the
        # index entries the marking left behind are vacuumed as autovacuum would.
        began = time.monotonic()
        marked = await outbox_set_aside.mark_waiting(source)
        await source.execute("VACUUM (ANALYZE) outbox_events")
        say(f"  outbox_events: {marked:,} rows marked waiting behind the set-aside row, and "
            f"vacuumed, in {time.monotonic() - began:.1f}s")  # fmt: skip
        # A year-old database has its history on disk: the gigabytes just written are
        # flushed now, not by a checkpoint in the middle of the figures measured next.
        began = time.monotonic()
        for conn in {id(source): source, id(target): target}.values():
            await conn.execute("CHECKPOINT")
        say(f"  checkpoint: {time.monotonic() - began:.1f}s")
    finally:
        await source.close()
        if target is not source:
            await target.close()
    return Seeded(done, time.monotonic() - started)


async def _fill(conn: asyncpg.Connection, table: str, sql: str) -> tuple[int, float]:
    """Run ``sql`` (an INSERT into ``table``) with the table's indexes dropped, then
    rebuild them; the rows inserted and the seconds it all took."""
    began = time.monotonic()
    async with conn.transaction():
        rebuild = await _drop_indexes(conn, table)
        status = await conn.execute(sql)
        for statement in rebuild:
            await conn.execute(statement)
    return int(status.split()[-1]), time.monotonic() - began


async def _drop_indexes(conn: asyncpg.Connection, table: str) -> list[str]:
    """Drop every index of ``table`` (constraints' included); the statements that rebuild
    them as they were."""
    found = await conn.fetch(
        "SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def,"
        " c.conname, pg_get_constraintdef(c.oid) AS condef"
        " FROM pg_index i LEFT JOIN pg_constraint c"
        " ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid"
        " WHERE i.indrelid = $1::regclass ORDER BY c.conname NULLS LAST",
        table,
    )
    rebuild: list[str] = []
    for index in found:
        if index["conname"]:
            await conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{index["conname"]}"')
            rebuild.insert(0, f'ALTER TABLE {table} ADD CONSTRAINT "{index["conname"]}" '
                              f"{index['condef']}")  # fmt: skip
        else:
            await conn.execute(f"DROP INDEX {index['name']}")
            rebuild.append(index["def"])
    return rebuild


def history_id(g: int, kind: str = "e") -> uuid.UUID:
    """The id the seeder gave history event ``g`` (``kind`` 'p': parked event ``g``)."""
    return uuid.UUID(hashlib.md5(f"{kind}{g}".encode()).hexdigest())


def sample_ids(sizes: Sizes) -> dict[str, Any]:
    """Ids a lookup at volume can ask for: an event in the middle of the year (outbox,
    inbox and claim), a dead-lettered one, a parked one behind its key's held head, and
    that key."""
    middle = min(sizes.outbox, sizes.inbox) // 2 or 1
    dead = sizes.dead_every * max(sizes.dead_letters // 2, 1)
    return {"event": history_id(middle), "dead": history_id(dead),
            "parked": history_id(sizes.held_heads + 1, "p"), "key": f"{KEY_PREFIX}0"}  # fmt: skip
