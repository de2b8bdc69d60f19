"""Counting a scenario (:mod:`chaos.engine.scenario`) against the intent and effects ledgers.

A scenario's events have no fixed fate: a long outage or a hostile handler may leave an
event processed, dead-lettered or (in the outbox) set aside. What must hold:

* every committed event is **settled**: processed (a dead letter replayed and then
  processed counts as processed); or dead-lettered with a reason code
  (``dead_letters`` row, inbox ``failed``); or set aside by the publisher with a reason
  (visible to the operator), or held behind such a row of its aggregate (order kept);
* an event whose INSERT PostgreSQL refused was never committed: it is counted *refused
  at the source*, not lost;
* **0 effects applied twice**: no message id answered 200 by its handler more than once
  (``handler_calls``, never deduplicated);
* events a scenario marks ``processed`` (valid, within every limit) are processed.

Anything else is **stuck** (unpublished, neither set aside nor held) or **lost**
(published, no final inbox outcome) and is a violation. The outbox's set-aside state is
read from whichever column the outbox has for it (:data:`SET_ASIDE_COLUMNS`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chaos.engine.breaches import flag
from chaos.engine.db import fetch
from chaos.engine.workload import Intent, Ledger
from shared.contracts.topology import Topology

#: Columns that, when the outbox has one and it is set, mean "set aside by the publisher".
SET_ASIDE_COLUMNS = ("set_aside_at", "failed_at", "parked_at", "quarantined_at")
#: Columns that may hold why a row was set aside (the first present is read).
SET_ASIDE_REASONS = ("set_aside_reason", "failed_reason", "publish_error")


@dataclass
class Settled:
    """Each committed event's fate, and the breaches."""

    committed: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    processed: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    set_aside: Counter[str] = field(default_factory=Counter)
    held_behind: int = 0
    stuck: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    no_reason: list[str] = field(default_factory=list)
    conflicting: list[str] = field(default_factory=list)
    effects_twice: list[str] = field(default_factory=list)
    applied_then_dead_lettered: int = 0
    duplicates_absorbed: int = 0
    not_processed_but_should: list[str] = field(default_factory=list)
    #: Each event's fate by id (``processed``, ``dead_letter:REASON``, ``set_aside``, …).
    fate: dict[str, str] = field(default_factory=dict)

    def violations(self) -> list[str]:
        """Every breach, one line each (empty: all invariants hold)."""
        out: list[str] = []
        flag(out, "STUCK in the outbox (unpublished, not set aside)", self.stuck, 4)
        flag(out, "LOST (published, no final outcome)", self.lost, 4)
        flag(out, "dead-lettered without a reason code", self.no_reason, 4)
        flag(out, "processed and dead-lettered both", self.conflicting, 4)
        flag(out, "EFFECTS APPLIED TWICE", self.effects_twice, 4)
        flag(out, "valid events within every limit not processed", self.not_processed_but_should, 4)
        return out


async def _columns(conn: asyncpg.Connection, table: str) -> set[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
    )
    return {r["column_name"] for r in rows}


async def read_outbox(dsn: str) -> dict[str, dict[str, Any]]:
    """id -> published, set_aside, reason, attempts, held (behind a set-aside row)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        columns = await _columns(conn, "outbox_events")
        aside = next((c for c in SET_ASIDE_COLUMNS if c in columns), None)
        reason = next((c for c in SET_ASIDE_REASONS if c in columns), "NULL")
        aside_sql = f"{aside} IS NOT NULL" if aside else "false"
        rows = await conn.fetch(
            "SELECT id::text AS id, seq, aggregate_type, aggregate_id,"
            " published_at IS NOT NULL AS published, publish_attempts,"
            f" ({aside_sql}) AS set_aside, {reason}::text AS reason FROM outbox_events"
            " ORDER BY seq"
        )
    finally:
        await conn.close()
    out: dict[str, dict[str, Any]] = {}
    blocked: set[tuple[str, str]] = set()
    for r in rows:
        key = (r["aggregate_type"], r["aggregate_id"])
        pending = not r["published"]
        out[r["id"]] = {
            "published": r["published"],
            "set_aside": pending and r["set_aside"],
            "reason": r["reason"] or "",
            "attempts": r["publish_attempts"],
            "held": pending and not r["set_aside"] and key in blocked,
        }
        if pending and r["set_aside"]:
            blocked.add(key)
    return out


async def read_inbox(dsn: str, durable: str) -> tuple[dict[str, str], dict[str, str], int]:
    """(id -> inbox status, id -> dead-letter reason, duplicates absorbed) of ``durable``."""
    inbox = await fetch(
        dsn,
        "SELECT message_id::text AS id, status, duplicates FROM inbox_messages WHERE durable = $1",
        durable,
    )
    # A dead letter replayed and then processed is settled as processed.
    dead = await fetch(
        dsn,
        "SELECT message_id::text AS id, reason_code FROM dead_letters d WHERE durable = $1"
        " AND NOT (status IN ('replaying', 'replayed') AND EXISTS (SELECT 1 FROM"
        " inbox_messages i WHERE i.durable = d.durable AND i.message_id = d.message_id"
        " AND i.status = 'processed'))",
        durable,
    )
    return (
        {r["id"]: r["status"] for r in inbox},
        {r["id"]: r["reason_code"] or "" for r in dead},
        sum(int(r["duplicates"] or 0) for r in inbox),
    )


async def read_effects(dsn: str, handler: str) -> tuple[Counter[str], set[str]]:
    """(id -> calls answered 200, ids applied) of ``handler``'s effects ledger."""
    ok = await fetch(
        dsn,
        "SELECT message_id::text AS id, count(*) AS n FROM handler_calls"
        " WHERE handler = $1 AND status = 200 GROUP BY message_id",
        handler,
    )
    applied = await fetch(
        dsn, "SELECT message_id::text AS id FROM handler_applied WHERE handler = $1", handler
    )
    return Counter({r["id"]: int(r["n"]) for r in ok}), {r["id"] for r in applied}


def committed_of(ledger: Ledger, outbox_ids: set[str]) -> tuple[list[Intent], Counter[str]]:
    """Committed intents (an unsure commit resolved by the outbox); refusals by case."""
    committed: list[Intent] = []
    refused: Counter[str] = Counter()
    for intent in ledger.intents.values():
        if intent.status == "committed" or (
            intent.status in ("uncertain", "pending") and intent.id in outbox_ids
        ):
            committed.append(intent)
        elif intent.status == "refused":
            refused[intent.klass.split("#")[0]] += 1  # a case's rounds counted together
    return committed, refused


async def count_settled(
    topology: Topology,
    dsns: dict[str, str],
    ledger: Ledger,
    must_process: AbstractSet[str] = frozenset(),
) -> Settled:
    """Every committed event's fate (see the module docstring)."""
    outbox: dict[str, dict[str, Any]] = {}
    for context, spec in topology.contexts.items():
        if spec.stream is not None:
            outbox.update(await read_outbox(dsns[context]))
    committed, refused = committed_of(ledger, set(outbox))
    settled = Settled(committed=len(committed), refused=refused)
    by_durable: dict[str, list[Intent]] = {}
    for intent in committed:
        by_durable.setdefault(intent.durable, []).append(intent)
    for durable, intents in sorted(by_durable.items()):
        target = topology.durables[durable].target
        inbox, dead, dupes = await read_inbox(dsns[target], durable)
        ok_calls, applied = await read_effects(dsns[target], target)
        settled.duplicates_absorbed += dupes
        for intent in intents:
            _settle_one(settled, intent, outbox.get(intent.id), inbox, dead)
        for message_id, n in ok_calls.items():
            if n > 1:
                settled.effects_twice.append(f"{message_id} ({n} calls answered 200)")
        settled.applied_then_dead_lettered += sum(
            1 for i in intents if i.id in applied and i.id in dead
        )
    for intent in committed:
        if intent.id in must_process and settled.fate.get(intent.id) != "processed":
            settled.not_processed_but_should.append(
                f"{intent.klass} → {settled.fate.get(intent.id, '?')}"
            )
    return settled


def _settle_one(
    settled: Settled,
    intent: Intent,
    row: dict[str, Any] | None,
    inbox: dict[str, str],
    dead: dict[str, str],
) -> None:
    mid = intent.id
    label = f"{mid} ({intent.klass})"
    status = inbox.get(mid)
    if mid in dead:
        reason = dead[mid]
        if not reason:
            settled.no_reason.append(label)
        if status == "processed":
            settled.conflicting.append(label)
        settled.dead_lettered[reason or "(none)"] += 1
        settled.fate[mid] = f"dead_letter:{reason}"
    elif status == "processed":
        settled.processed += 1
        settled.fate[mid] = "processed"
    elif row is not None and not row["published"]:
        if row["set_aside"]:
            settled.set_aside[row["reason"][:60] or "(no reason)"] += 1
            settled.fate[mid] = "set_aside"
        elif row["held"]:
            settled.held_behind += 1
            settled.fate[mid] = "held_behind_set_aside"
        else:
            settled.stuck.append(
                f"{label} {row['attempts']} attempts, last error {row['reason'][:80]!r}"
            )
            settled.fate[mid] = "stuck"
    else:
        settled.lost.append(f"{label} inbox {status or 'no row'}")
        settled.fate[mid] = f"lost:{status or 'no row'}"
