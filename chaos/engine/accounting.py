"""After the drain: count everything against the intent ledger and check the invariants.

Sources, all read directly (not through the proxies):

* the intent ledger (:mod:`chaos.engine.workload`) — what was committed, and each event's class;
* each context's ``outbox_events`` and event stream (every message, read by sequence);
* each durable's ``inbox_messages``, ``dead_letters`` and dead-letter stream records;
* the target handler's effects ledger: ``handler_calls`` (every call, never deduplicated)
  and ``handler_applied`` (the effect's claim, committed with the effect).

Invariants (ISSUE 6): 0 lost — every committed event processed or dead-lettered as its
class says; dead letters = the poison set plus the exhausted set, exactly (table, inbox
and dead-letter stream agree); each id at most once in its stream; 0 effects applied
twice. Handler calls for an already-applied id are counted; each must have been answered
409 (or not at all, when the handler's own database failed under it) and must fall in a
fault's window.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from chaos.engine.breaches import flag
from chaos.engine.db import fetch
from chaos.engine.faults import FaultRecord
from chaos.engine.workload import Intent, Ledger
from shared.contracts.topology import Topology, subject_matches

#: Seconds around a redundant call in which a fault explains it (see :func:`explained`).
WINDOW_SLACK = 3.0
#: Seconds more after a fault on a handler link: the consumer's circuit breaker, opened by
#: it, holds the messages in hand until its next probe (``probe_every``, 5 s by default,
#: plus the probe's own call); an inbox lease can run out meanwhile, and a copy
#: redelivered by another fault (a NATS restart) then claims and calls too (a 409).
BREAKER_HOLD = 6.0
#: Concurrent get_msg requests while reading a stream back.
READ_CONCURRENCY = 64
#: Times one get_msg is asked before a timeout fails the read (a server busy on a loaded
#: machine answers some of 200,000 requests late; one late answer must not lose the count).
READ_ATTEMPTS = 3


@dataclass
class Call:
    """One row of handler_calls."""

    id: int
    message_id: str
    status: int | None
    attempt: int | None
    at: float


@dataclass
class DurableCount:
    """Everything counted for one durable."""

    durable: str
    expected: int = 0
    expected_dead: int = 0
    processed: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    wrong_outcome: list[str] = field(default_factory=list)
    missing_dead_letters: list[str] = field(default_factory=list)
    unexpected_dead_letters: list[str] = field(default_factory=list)
    inbox_table_mismatch: list[str] = field(default_factory=list)
    dlq_stream_mismatch: list[str] = field(default_factory=list)
    dlq_duplicates: list[str] = field(default_factory=list)
    double_effects: list[str] = field(default_factory=list)
    unapplied_processed: list[str] = field(default_factory=list)
    applied_not_processed: list[str] = field(default_factory=list)
    calls: int = 0
    calls_by_status: Counter[str] = field(default_factory=Counter)
    redundant: Counter[str] = field(default_factory=Counter)
    redundant_wrong: list[str] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    reason_notes: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    inbox_duplicates: int = 0


@dataclass
class ContextCount:
    """Everything counted for one producing context."""

    context: str
    committed: int = 0
    published: int = 0
    in_stream: int = 0
    stream_duplicates: list[str] = field(default_factory=list)
    missing_from_stream: list[str] = field(default_factory=list)
    unpublished: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)


@dataclass
class Accounts:
    """The whole count, and the verdict."""

    committed: int
    uncertain_committed: int
    uncertain_absent: int
    by_class: Counter[str]
    contexts: dict[str, ContextCount]
    durables: dict[str, DurableCount]
    violations: list[str]

    @property
    def ok(self) -> bool:
        """All invariants hold."""
        return not self.violations

    def totals(self) -> dict[str, int]:
        """The invariants' counts over every durable and stream (a results table's rows)."""
        durables = self.durables.values()
        return {
            "lost": sum(len(d.lost) for d in durables),
            "effects applied twice": sum(len(d.double_effects) for d in durables),
            "dead letters (expected)": sum(d.expected_dead for d in durables),
            "dead letters (found)": sum(sum(d.dead_letters.values()) for d in durables),
            "ids twice in a stream": sum(len(c.stream_duplicates) for c in self.contexts.values()),
        }


def committed_intents(ledger: Ledger, outbox_ids: set[str]) -> tuple[list[Intent], int, int]:
    """Committed intents (uncertain ones resolved by the outbox); and how they resolved."""
    committed, yes, no = [], 0, 0
    for intent in ledger.intents.values():
        if intent.status == "committed":
            committed.append(intent)
        elif intent.status in ("uncertain", "pending"):
            if intent.id in outbox_ids:
                committed.append(intent)
                yes += 1
            else:
                no += 1
    return committed, yes, no


async def read_stream(
    js: JetStreamContext, stream: str, seqs: tuple[int, int] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(Nats-Msg-Id, decoded body) of every message in ``stream``, in order; of those in
    the inclusive sequence range ``seqs`` only, when given."""
    info = await js.stream_info(stream)
    first, last = info.state.first_seq, info.state.last_seq
    if not info.state.messages:
        return []
    if seqs is not None:
        first, last = max(first, seqs[0]), min(last, seqs[1])
    gate = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(seq: int) -> tuple[str, dict[str, Any]] | None:
        async with gate:
            for attempt in range(1, READ_ATTEMPTS + 1):
                try:
                    raw = await js.get_msg(stream, seq)
                    break
                except NotFoundError:
                    return None
                except TimeoutError:  # nats.errors.TimeoutError is one
                    if attempt == READ_ATTEMPTS:
                        raise
        body: Any = json.loads(raw.data or b"{}")
        return (raw.headers or {}).get("Nats-Msg-Id", ""), body if isinstance(body, dict) else {}

    found = await asyncio.gather(*(one(seq) for seq in range(first, last + 1)))
    return [m for m in found if m is not None]


async def count_everything(
    *,
    topology: Topology,
    dsns: dict[str, str],
    js: JetStreamContext,
    ledger: Ledger,
    faults: list[FaultRecord],
) -> Accounts:
    """Read every source and check every invariant (see the module docstring)."""
    outbox: dict[str, dict[str, bool]] = {}
    for context, spec in topology.contexts.items():
        if spec.stream is not None:
            rows = await fetch(
                dsns[context],
                "SELECT id::text AS id, published_at IS NOT NULL AS published FROM outbox_events",
            )
            outbox[context] = {r["id"]: r["published"] for r in rows}
    all_outbox = {i for ids in outbox.values() for i in ids}
    committed, yes, no = committed_intents(ledger, all_outbox)
    violations: list[str] = []
    contexts = {
        context: await _count_context(topology, context, ids, committed, js, violations)
        for context, ids in outbox.items()
    }
    durables = {
        name: await _count_durable(topology, name, dsns, committed, js, faults, violations)
        for name in sorted(topology.durables)
    }
    attempted = {i.id for i in ledger.intents.values() if i.status != "planned"}
    for context, ids in outbox.items():
        strays = sorted(set(ids) - {i.id for i in committed} - attempted)
        if strays:
            violations.append(f"{context}: {len(strays)} outbox rows the workload never wrote")
    return Accounts(
        committed=len(committed),
        uncertain_committed=yes,
        uncertain_absent=no,
        by_class=Counter(i.klass for i in committed),
        contexts=contexts,
        durables=durables,
        violations=violations,
    )


async def _count_context(
    topology: Topology,
    context: str,
    outbox: dict[str, bool],
    committed: list[Intent],
    js: JetStreamContext,
    violations: list[str],
) -> ContextCount:
    spec = topology.contexts[context].stream
    assert spec is not None
    mine = {i.id for i in committed if i.context == context}
    count = ContextCount(context, committed=len(mine))
    count.published = sum(1 for i in mine if outbox.get(i))
    count.unpublished = sorted(i for i in mine if not outbox.get(i))
    in_stream = Counter(msg_id for msg_id, _ in await read_stream(js, spec.name))
    count.in_stream = len(in_stream)
    count.stream_duplicates = sorted(i for i, n in in_stream.items() if n > 1)
    count.missing_from_stream = sorted(mine - set(in_stream))
    count.phantoms = sorted(set(in_stream) - mine)
    flag(violations, f"{context}: committed but never published", count.unpublished)
    flag(violations, f"{spec.name}: committed but not in the stream", count.missing_from_stream)
    flag(violations, f"{spec.name}: ids more than once in the stream", count.stream_duplicates)
    flag(violations, f"{spec.name}: messages the workload never committed", count.phantoms)
    return count


def _dlq_stream(topology: Topology, subject: str) -> str:
    for spec in topology.dead_letter_streams:
        if any(subject_matches(pattern, subject) for pattern in spec.subjects):
            return spec.name
    raise KeyError(subject)


async def _count_durable(
    topology: Topology,
    durable: str,
    dsns: dict[str, str],
    committed: list[Intent],
    js: JetStreamContext,
    faults: list[FaultRecord],
    violations: list[str],
) -> DurableCount:
    spec = topology.durables[durable]
    dsn = dsns[spec.target]
    inbox = {
        r["id"]: r
        for r in await fetch(
            dsn,
            "SELECT message_id::text AS id, status, reason_code, duplicates"
            " FROM inbox_messages WHERE durable = $1",
            durable,
        )
    }
    dead = {
        r["id"]: r
        for r in await fetch(
            dsn,
            "SELECT message_id::text AS id, reason_code, source, generation"
            " FROM dead_letters WHERE durable = $1",
            durable,
        )
    }
    records = [
        body
        for _, body in await read_stream(js, _dlq_stream(topology, spec.dead_letter_subject))
        if body.get("durable") == durable
    ]
    mine = {i.id: i for i in committed if i.durable == durable}
    count = DurableCount(durable, expected=len(mine))
    count.inbox_duplicates = sum(int(r["duplicates"]) for r in inbox.values())
    _outcomes(count, mine, inbox, dead)
    _dead_letter_sets(count, mine, inbox, dead, records)
    await _effects(count, spec.target, dsn, mine, inbox, faults)
    _report_durable(count, violations)
    return count


def _outcomes(
    count: DurableCount,
    mine: dict[str, Intent],
    inbox: dict[str, asyncpg.Record],
    dead: dict[str, asyncpg.Record],
) -> None:
    for message_id, intent in mine.items():
        row = inbox.get(message_id)
        status = row["status"] if row is not None else None
        if status == "processed":
            outcome = "processed"
            count.processed += 1
        elif status == "failed" and message_id in dead:
            outcome = "dead_letter"
            count.dead_letters[dead[message_id]["reason_code"]] += 1
        else:
            count.lost.append(f"{message_id} ({intent.klass}; inbox {status or 'no row'})")
            continue
        if outcome != intent.expected:
            count.wrong_outcome.append(f"{message_id} ({intent.klass} → {outcome})")
    count.phantoms = sorted(set(inbox) - set(mine))


def _dead_letter_sets(
    count: DurableCount,
    mine: dict[str, Intent],
    inbox: dict[str, asyncpg.Record],
    dead: dict[str, asyncpg.Record],
    records: list[dict[str, Any]],
) -> None:
    expected = {i for i, intent in mine.items() if intent.expected == "dead_letter"}
    count.expected_dead = len(expected)
    recorded = set(dead)
    count.missing_dead_letters = sorted(expected - recorded)
    count.unexpected_dead_letters = sorted(
        f"{i} ({mine[i].klass if i in mine else 'unknown'}: {dead[i]['reason_code']})"
        for i in recorded - expected
    )
    failed = {i for i, r in inbox.items() if r["status"] == "failed"}
    count.inbox_table_mismatch = sorted(failed ^ recorded)
    in_dlq = Counter(str(r.get("message_id")) for r in records)
    count.dlq_duplicates = sorted(i for i, n in in_dlq.items() if n > 1)
    count.dlq_stream_mismatch = sorted(set(in_dlq) ^ recorded)
    wanted = {"poison": "HANDLER_REJECTED", "exhausting": "MAX_DELIVERIES_EXCEEDED"}
    for message_id in recorded & expected:
        reason = dead[message_id]["reason_code"]
        if reason != wanted[mine[message_id].klass]:
            count.reason_notes.append(f"{message_id} ({mine[message_id].klass}: {reason})")


async def _effects(
    count: DurableCount,
    handler: str,
    dsn: str,
    mine: dict[str, Intent],
    inbox: dict[str, asyncpg.Record],
    faults: list[FaultRecord],
) -> None:
    calls: dict[str, list[Call]] = defaultdict(list)
    for r in await fetch(
        dsn,
        "SELECT id, message_id::text AS mid, status, attempt,"
        " extract(epoch FROM called_at)::float8 AS at"
        " FROM handler_calls WHERE handler = $1 ORDER BY id",
        handler,
    ):
        calls[r["mid"]].append(Call(r["id"], r["mid"], r["status"], r["attempt"], r["at"]))
    applied = {
        r["mid"]: float(r["at"])
        for r in await fetch(
            dsn,
            "SELECT message_id::text AS mid, extract(epoch FROM applied_at)::float8 AS at"
            " FROM handler_applied WHERE handler = $1",
            handler,
        )
    }
    count.calls = sum(len(c) for c in calls.values())
    count.calls_by_status = Counter(str(c.status) for cs in calls.values() for c in cs)
    processed = {i for i, r in inbox.items() if r["status"] == "processed"}
    count.unapplied_processed = sorted(i for i in processed if i in mine and i not in applied)
    count.applied_not_processed = sorted(i for i in applied if i not in processed)
    for message_id, at in applied.items():
        _redundant(count, message_id, at, calls.get(message_id, []), faults)


def _redundant(
    count: DurableCount,
    message_id: str,
    applied_at: float,
    calls: list[Call],
    faults: list[FaultRecord],
) -> None:
    """Count the calls after the one that applied ``message_id``."""
    ok_calls = [c for c in calls if c.status == 200]
    if len(ok_calls) > 1:
        count.double_effects.append(f"{message_id} ({len(ok_calls)} calls answered 200)")
    if ok_calls:
        applying = ok_calls[0]
    else:  # no 200 row: only a ledger written before the effect commits can leave this
        before = [c for c in calls if c.at <= applied_at]
        if not before:
            return
        applying = before[-1]
    for call in calls:
        if call.id <= applying.id:
            continue
        count.redundant[str(call.status)] += 1
        if call.status is not None and call.status != 409 and call.status < 500:
            count.redundant_wrong.append(f"{message_id} answered {call.status}")
        if not explained(count.durable, applied_at, call.at, faults):
            count.unexplained.append(f"{message_id} at {call.at:.3f} (applied {applied_at:.3f})")


def explained(durable: str, applied_at: float, call_at: float, faults: list[FaultRecord]) -> bool:
    """Whether a fault touching ``durable`` was under way between the effect and the call.

    The answer to the applying call was lost somewhere between ``applied_at`` and the
    consumer's inbox update; a fault that could lose it (a consumer kill, a PostgreSQL
    crash, a fault on the consumer's database or handler link, or on the handler's
    database link) must overlap ``[applied_at - slack, call_at]`` (longer after a handler
    fault: :data:`BREAKER_HOLD`).
    """
    for fault in faults:
        if not fault.ok or not (durable in fault.affects or "*" in fault.affects):
            continue
        slack = WINDOW_SLACK + (BREAKER_HOLD if fault.kind.startswith("handler_") else 0.0)
        if fault.started <= call_at and fault.ended + slack >= applied_at:
            return True
    return False


def _report_durable(count: DurableCount, violations: list[str]) -> None:
    d = count.durable
    flag(violations, f"{d}: LOST (no final outcome)", count.lost)
    flag(violations, f"{d}: outcome differs from the event's class", count.wrong_outcome)
    flag(violations, f"{d}: expected dead letters missing", count.missing_dead_letters)
    flag(
        violations,
        f"{d}: dead letters not in the poison/exhausted set",
        count.unexpected_dead_letters,
    )
    flag(violations, f"{d}: inbox 'failed' and dead_letters disagree", count.inbox_table_mismatch)
    flag(
        violations, f"{d}: dead-letter stream and dead_letters disagree", count.dlq_stream_mismatch
    )
    flag(violations, f"{d}: ids more than once in the dead-letter stream", count.dlq_duplicates)
    flag(violations, f"{d}: EFFECTS APPLIED TWICE", count.double_effects)
    flag(violations, f"{d}: processed but never applied", count.unapplied_processed)
    flag(violations, f"{d}: applied but not processed", count.applied_not_processed)
    flag(violations, f"{d}: redundant calls not answered 409", count.redundant_wrong)
    flag(violations, f"{d}: redundant calls outside any crash window", count.unexplained)
    flag(violations, f"{d}: inbox rows the workload never committed", count.phantoms)
