"""The workload: events committed through the producer API, and the intent ledger.

Every event is decided up front from the seed: its id, context, type, payload and
*class*, which says what must become of it:

============  ==========================================  ===========================
class         payload directive (``_ferry_test``)          expected outcome
============  ==========================================  ===========================
normal        none                                        processed, applied once
slow          ``slow_ms`` 100-400 (widens crash windows)  processed, applied once
transient     ``fail_attempts`` 1-3, ``retry_after`` 0.2  processed, applied once
poison        ``poison``                                  dead letter HANDLER_REJECTED
exhausting    ``fail_attempts`` 1000, ``retry_after`` 0.1 dead letter MAX_DELIVERIES
============  ==========================================  ===========================

The *intent ledger* is the independent record the accounting counts against: each
event is written ``pending`` before its transaction, ``committed`` once COMMIT returned,
``uncertain`` when the connection died during COMMIT (resolved after the run by looking
the id up in the outbox) and ``aborted`` when the transaction never reached COMMIT. It is
kept in memory and appended to ``ledger.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from shared.adapters.postgres import DATABASE_ERRORS
from shared.adapters.producer import record_event
from shared.contracts.topology import EventSpec, Topology
from shared.waits import sleep_unless, within

log = logging.getLogger("chaos.engine.workload")

#: (class, share of events). The rest is ``normal``.
CLASS_SHARES: tuple[tuple[str, float], ...] = (
    ("poison", 0.01),
    ("exhausting", 0.005),
    ("transient", 0.05),
    ("slow", 0.03),
)
#: What each class must end as.
EXPECTED = {
    "normal": "processed",
    "slow": "processed",
    "transient": "processed",
    "poison": "dead_letter",
    "exhausting": "dead_letter",
}
#: Most events per producer transaction (a transaction commits 1..N events).
MAX_PER_TRANSACTION = 4
#: What closing a connection to a dead server may raise.
CLOSE_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, TimeoutError)
#: Aggregates per context (events of one aggregate keep their order in the stream).
AGGREGATES = 40


@dataclass
class Intent:
    """One event the workload means to commit."""

    id: str
    context: str
    durable: str
    event_type: str
    version: int
    klass: str
    aggregate_id: str
    payload: dict[str, Any]
    due: float
    status: str = "planned"
    committed_at: float | None = None

    @property
    def expected(self) -> str:
        """``processed`` or ``dead_letter``."""
        return EXPECTED[self.klass]


def directive(
    klass: str, rng: random.Random, slow_ms: tuple[int, int] = (100, 400)
) -> dict[str, Any] | None:
    """The payload directive (``_ferry_test``) that makes the test handler treat an event of
    ``klass`` as the class says (None: an ordinary event)."""
    if klass == "poison":
        return {"poison": True}
    if klass == "exhausting":
        return {"fail_attempts": 1000, "retry_after": 0.1}
    if klass == "transient":
        return {"fail_attempts": rng.randint(1, 3), "retry_after": 0.2}
    if klass == "slow":
        return {"slow_ms": rng.randint(*slow_ms)}
    return None


def _payload(event: EventSpec, key: str, n: int) -> dict[str, Any]:
    """A payload satisfying the event's declared schema (its required properties)."""
    schema = event.payload_schema or {}
    properties = schema.get("properties", {})
    payload: dict[str, Any] = {}
    for name in schema.get("required", []):
        kind = properties.get(name, {}).get("type", "string")
        if kind == "integer":
            payload[name] = n
        elif kind == "number":
            payload[name] = n / 10
        elif name.endswith("_id") or name.endswith("_key"):
            payload[name] = key
        else:
            payload[name] = f"{name} {n}"
    return payload


def plan_events(
    topology: Topology,
    seed: int,
    count: int,
    seconds: float,
    *,
    context: str | None = None,
    only: str | None = None,
) -> list[Intent]:
    """``count`` events spread evenly over ``seconds``, all decided by ``seed``: of every
    context's handled types, or of ``context``'s only; each of a class drawn by
    :data:`CLASS_SHARES`, or every one of class ``only``."""
    rng = random.Random(f"workload-{seed}")
    producible = [e for e in topology.events if e.handled_by and context in (None, e.context)]
    intents = []
    for n in range(count):
        event = rng.choice(producible)
        klass = only or _draw_class(rng)
        aggregate = f"{event.type.split('_')[0]}-{rng.randrange(AGGREGATES)}"
        test = directive(klass, rng)
        intents.append(
            make_intent(rng, event, n, aggregate, klass, test, seconds * n / max(count, 1))
        )
    return intents


def _draw_class(rng: random.Random) -> str:
    """A class by :data:`CLASS_SHARES` (``normal`` for the rest)."""
    roll, edge = rng.random(), 0.0
    for name, share in CLASS_SHARES:
        edge += share
        if roll < edge:
            return name
    return "normal"


def make_intent(
    rng: random.Random,
    event: EventSpec,
    n: int,
    aggregate: str,
    klass: str,
    test: dict[str, Any] | None,
    due: float,
    durable: str | None = None,
) -> Intent:
    """The ``n``-th planned event: of ``event``'s type, for ``aggregate``, of ``klass`` (its
    payload directive ``test``, if any), committed ``due`` seconds into the run, for
    ``durable`` (default: the first durable handling the event)."""
    payload = _payload(event, aggregate, n)
    if test is not None:
        payload["_ferry_test"] = test
    return Intent(
        id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        context=event.context,
        durable=durable or event.handled_by[0],
        event_type=event.type,
        version=event.version,
        klass=klass,
        aggregate_id=aggregate,
        payload=payload,
        due=due,
    )


@dataclass
class Ledger:
    """The intent ledger (see the module docstring)."""

    path: Path
    intents: dict[str, Intent] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def mark(self, intents: list[Intent], status: str) -> None:
        """Record a status for each of ``intents`` (in memory and in the file)."""
        now = time.time()
        with self.path.open("a") as out:
            for intent in intents:
                intent.status = status
                if status == "committed":
                    intent.committed_at = now
                self.intents[intent.id] = intent
                out.write(
                    json.dumps(
                        {
                            "at": round(now, 3),
                            "id": intent.id,
                            "status": status,
                            "context": intent.context,
                            "durable": intent.durable,
                            "class": intent.klass,
                            "event": f"{intent.event_type}.v{intent.version}",
                        }
                    )
                    + "\n"
                )

    def by_status(self, status: str) -> list[Intent]:
        """Intents currently in ``status``."""
        return [i for i in self.intents.values() if i.status == status]

    def count(self, status: str) -> int:
        """How many intents are in ``status``."""
        return sum(1 for i in self.intents.values() if i.status == status)


class Producer:
    """Commits one context's planned events on time, riding out database outages."""

    def __init__(self, context: str, dsn: str, intents: list[Intent], ledger: Ledger) -> None:
        self.context, self.dsn, self.ledger = context, dsn, ledger
        self.queue = [i for i in intents if i.context == context]
        self.transactions = 0
        self.reconnects = 0

    async def run(self, started: float, stop: asyncio.Event) -> None:
        """Commit every planned event (late ones in bigger batches) until done or ``stop``."""
        conn: asyncpg.Connection | None = None
        index = 0
        try:
            while index < len(self.queue) and not stop.is_set():
                due = [i for i in self.queue[index : index + MAX_PER_TRANSACTION]]
                wait = started + due[0].due - time.monotonic()
                if wait > 0:
                    await sleep_unless(stop, wait)
                    continue
                ready = [i for i in due if started + i.due <= time.monotonic()]
                if conn is None or conn.is_closed():
                    conn = await self._connect(stop)
                    if conn is None:
                        return
                if await self._commit(conn, ready):
                    index += len(ready)
                else:
                    await _close(conn)
                    conn = None
        finally:
            if conn is not None:
                await _close(conn)

    async def _connect(self, stop: asyncio.Event) -> asyncpg.Connection | None:
        delay = 0.1
        while not stop.is_set():
            try:
                return await asyncpg.connect(self.dsn, timeout=3)
            except DATABASE_ERRORS as exc:
                self.ledger.errors[f"connect: {type(exc).__name__}"] += 1
                self.reconnects += 1
                await sleep_unless(stop, delay)
                delay = min(delay * 2, 1.0)
        return None

    async def _commit(self, conn: asyncpg.Connection, batch: list[Intent]) -> bool:
        """One transaction; True when its outcome is known (committed or refused for good)."""
        self.ledger.mark(batch, "pending")
        tx = conn.transaction()
        try:
            await tx.start()
            for intent in batch:
                await record_event(
                    conn,
                    aggregate_type=intent.event_type.split("_")[0],
                    aggregate_id=intent.aggregate_id,
                    event_type=intent.event_type,
                    event_version=intent.version,
                    payload=intent.payload,
                    event_id=intent.id,
                    context=intent.context,
                )
        except DATABASE_ERRORS as exc:
            self.ledger.errors[f"insert: {type(exc).__name__}"] += 1
            self.ledger.mark(batch, "aborted")
            for intent in batch:
                intent.status = "planned"  # try again on a fresh connection
            return False
        try:
            await tx.commit()
        except DATABASE_ERRORS as exc:
            # The COMMIT may or may not have happened: the outbox will tell, after the run.
            self.ledger.errors[f"commit: {type(exc).__name__}"] += 1
            self.ledger.mark(batch, "uncertain")
            return True
        self.transactions += 1
        self.ledger.mark(batch, "committed")
        return True


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await within(2, conn.close())
    except CLOSE_ERRORS:
        conn.terminate()
