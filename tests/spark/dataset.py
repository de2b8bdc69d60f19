"""A generated dataset whose KPIs are known in advance, and the independent expectation.

Each :class:`Ev` is one event: when it occurred, who produced it and what became of it
(its :class:`Fate`). :func:`load` writes it the way the platform would: the outbox row
through the real producer API (``record_event``), ``published_at`` as the publisher
sets it, and the inbox / dead-letter rows with exactly the columns the inbox-consumer
and the dlq-router write. :func:`expected` computes the KPIs from the specs alone, in
plain Python (numpy for the percentiles), never from the databases.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import asyncpg
import numpy as np

from shared.adapters.producer import record_event
from tests.spark.conftest import KpiWorld

#: processed     processed at once (the pipeline's own latency)
#: dead          dead-lettered (its dead letter held)
#: unreceived    published, and no record of it anywhere: lost
#: stuck         received, a delivery failed, not final: retrying (not lost)
#: inflight      received, being handled, nothing failed yet: in flight (not lost)
#: parked        received and parked behind its key's held head (ordering: key): parked
#: held          the held head itself: dead-lettered, its dead letter and parked row held
#: waited        processed after waiting behind a held head (inbox held_by set)
#: replayed      dead-lettered, replayed, then processed (its dead letter replayed)
#: unpublished   still in the outbox
Kind = Literal[
    "processed", "dead", "unreceived", "stuck", "inflight", "parked", "held", "waited",
    "replayed", "unpublished",
]  # fmt: skip
#: Kinds with an inbox row, processed ones, dead-lettered ones, and those whose latency
#: is an operator's (waited for one), not the pipeline's own.
RECEIVED = ("processed", "dead", "stuck", "inflight", "parked", "held", "waited", "replayed")
PROCESSED = ("processed", "waited", "replayed")
DEAD = ("dead", "held", "replayed")
WAITED = ("waited", "replayed")
#: The place a kind is counted in besides processed and dead-lettered (lost: if subscribed).
PLACE_COLUMN = {"unreceived": "lost_candidates", "parked": "parked", "stuck": "retrying",
                "inflight": "in_flight"}  # fmt: skip
#: Inbox status of each received kind.
INBOX_STATUS = {
    "processed": "processed", "waited": "processed", "replayed": "processed", "dead": "failed",
    "held": "failed", "stuck": "retrying", "inflight": "processing", "parked": "received",
}  # fmt: skip
#: The id of the held head the "waited" events waited behind.
HELD_HEAD = uuid.UUID(int=42)
#: Who receives what in the test topology (vibespro takes model_published only).
DURABLE_OF = {
    ("sea", "model_published"): "vibespro__from_sea",
    ("vibespro", "vibe_created"): "sea__from_vibespro",
}
TARGET_OF = {"vibespro__from_sea": "vibespro", "sea__from_vibespro": "sea"}
NAMESPACE = {"sea": "sea.event", "vibespro": "vibespro.event"}
#: The publisher marks an event published this long after it occurred.
PUBLISH_MS = 2.0


@dataclass(frozen=True)
class Fate:
    """What became of an event at its durable."""

    kind: Kind
    latency_ms: float | None = None
    handler_status: int = 200
    duplicates: int = 0
    retries: tuple[str, ...] = ()
    dead_reason: str | None = None
    #: Publish → first receipt; default: a quarter of the latency, else 10 ms.
    lag_ms: float | None = None

    def lag(self) -> float:
        if self.lag_ms is not None:
            return self.lag_ms
        return self.latency_ms / 4 if self.latency_ms is not None else 10.0

    def attempts(self) -> int:
        """Deliveries the inbox row counts (a parked event was never handed over)."""
        extra = {"stuck": 0, "parked": 0, "inflight": 1 - len(self.retries)}
        return len(self.retries) + extra.get(self.kind, 1)


@dataclass
class Ev:
    """One event of the dataset."""

    window: int
    offset_s: float
    context: str
    event_type: str
    version: int
    fate: Fate
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    @property
    def subject(self) -> str:
        return f"{NAMESPACE[self.context]}.{self.event_type}.v{self.version}"

    @property
    def durable(self) -> str:
        return DURABLE_OF.get((self.context, self.event_type), "-")

    def occurred(self, base: datetime, window_seconds: int) -> datetime:
        return base + timedelta(seconds=self.window * window_seconds + self.offset_s)


def processed(latency: float, **kw: Any) -> Fate:
    return Fate("processed", latency_ms=latency, **kw)


def standard_events() -> list[Ev]:
    """The main dataset: the fates of an ``ordering: none`` durable, an empty window, a p99
    breach, a lost event."""
    latencies = [12.5, 20, 31, 44, 47, 58, 60, 75, 81, 99, 110, 130, 150, 170, 199, 420]
    events = []
    for i, latency in enumerate(latencies):
        extra: dict[str, Any] = {}
        if i == 3:
            extra["handler_status"] = 409
        if i == 5:
            extra["duplicates"] = 2
        if i == 7:
            extra["retries"] = ("HTTP_503",)
        events.append(Ev(0, 60 * i + 0.5, "sea", "model_published", 1, processed(latency, **extra)))
    events += [
        Ev(0, 16 * 60, "sea", "model_published", 1,
           Fate("dead", retries=("HTTP_503",), dead_reason="HANDLER_REJECTED")),
        Ev(0, 17 * 60, "sea", "model_published", 1,
           Fate("dead", retries=("HTTP_500",) * 3, dead_reason="MAX_DELIVERIES_EXCEEDED")),
        Ev(0, 18 * 60, "sea", "model_published", 1, Fate("unreceived")),
        Ev(0, 19 * 60, "sea", "model_published", 1, Fate("stuck", retries=("HTTP_503",))),
        Ev(0, 20 * 60, "sea", "model_archived", 1, Fate("unreceived")),
        Ev(0, 21 * 60, "sea", "model_archived", 1, Fate("unpublished")),
    ]  # fmt: skip
    events += [
        Ev(0, 100 + 60 * i, "vibespro", "vibe_created", 1, processed(5 + i)) for i in range(5)
    ]
    events.append(Ev(0, 900, "vibespro", "vibe_created", 1, Fate("unpublished")))
    # Window 1 stays empty.
    events += [
        Ev(2, 10 + i, "sea", "model_published", 1, processed(lat))
        for i, lat in enumerate([100, 200, 900])
    ]
    events += [Ev(2, 30 + i, "vibespro", "vibe_created", 2, processed(lat))
               for i, lat in enumerate([30, 40])]  # fmt: skip
    events.append(Ev(3, 0.0, "sea", "model_published", 1, processed(15)))
    return events


def operator_events() -> list[Ev]:
    """An ``ordering: key`` durable under ``on_dead_letter: hold`` (issue 42): a held head
    with events parked behind it, events processed after waiting for an operator, one
    retrying, one in flight, and one truly lost; the rest clean and fast."""
    published = ("sea", "model_published", 1)
    events = clean_events(window=0, count=6)
    events += [
        Ev(0, 100, *published, Fate("held", retries=("HTTP_503",), dead_reason="HANDLER_REJECTED")),
        *(Ev(0, 101 + i, *published, Fate("parked")) for i in range(5)),
        Ev(0, 200, *published, Fate("waited", latency_ms=90_000.0)),
        Ev(0, 201, *published, Fate("waited", latency_ms=60_000.0)),
        Ev(0, 202, *published, Fate("replayed", latency_ms=150_000.0, retries=("HTTP_500",),
                                    dead_reason="HANDLER_REJECTED")),
        Ev(0, 300, *published, Fate("stuck", retries=("HTTP_503", "HTTP_503"))),
        Ev(0, 301, *published, Fate("inflight")),
        Ev(0, 400, *published, Fate("unreceived")),
        Ev(0, 500, "vibespro", "vibe_created", 1, processed(8)),
    ]  # fmt: skip
    return events


def clean_events(window: int = 0, count: int = 10) -> list[Ev]:
    """Events that all went well (fast, processed once)."""
    return [Ev(window, 5 + i, "sea", "model_published", 1, processed(10 + i)) for i in range(count)]


# ---- writing the rows


def _entry(attempt: int, at: datetime, reason: str, status: int | None) -> dict[str, Any]:
    return {"attempt": attempt, "at": at.isoformat(), "status": status, "reason": reason,
            "detail": f"{reason} on attempt {attempt}"}  # fmt: skip


_INBOX = """
INSERT INTO inbox_messages (message_id, durable, subject, received_at, processed_at, attempts,
  last_error, status, event_type, event_version, occurred_at, stream_seq, handler_status,
  reason_code, duplicates, retry_history, dlq_metadata, held_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16::jsonb, $17::jsonb,
  $18)
"""
_PARKED = """
INSERT INTO parked_messages (durable, ordering_key, stream_seq, message_id, delivered_seq,
  subject, data, state, reason)
VALUES ($1, 'key-1', $2, $3, $2, $4, '\\x7b7d'::bytea, $5, $6)
"""
_DEAD_LETTER = """
INSERT INTO dead_letters (durable, message_id, stream, stream_seq, original_subject, event_type,
  event_version, reason_code, last_error, attempts, record, dlq_subject, source,
  first_dead_lettered_at, dead_lettered_at, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14, $14, $15)
"""


def _inbox_args(ev: Ev, occurred: datetime, seq: int) -> tuple[Any, ...]:
    f = ev.fate
    published = occurred + timedelta(milliseconds=PUBLISH_MS)
    received = published + timedelta(milliseconds=f.lag())
    history = [_entry(n + 1, received + timedelta(seconds=n), r, 503)
               for n, r in enumerate(f.retries)]  # fmt: skip
    attempts = f.attempts()
    status = INBOX_STATUS[f.kind]
    processed_at, handler, reason = None, 503, (f.retries or (None,))[-1]
    dlq: dict[str, Any] | None = None
    if status == "processed":
        assert f.latency_ms is not None
        processed_at = occurred + timedelta(milliseconds=f.latency_ms)
        handler = f.handler_status
    elif status == "failed":
        handler, reason = 422, f.dead_reason
        history.append(_entry(attempts, received + timedelta(seconds=attempts), str(reason), 422))
        dlq = {"reason": reason, "replay_attempts": 0}
    elif f.kind in ("inflight", "parked"):
        handler, reason = None, None
    return (
        ev.id, ev.durable, ev.subject, received, processed_at, attempts,
        None if status in ("processed", "processing", "received") else "failed", status,
        ev.event_type, ev.version, occurred, seq, handler, reason, f.duplicates,
        json.dumps(history), None if dlq is None else json.dumps(dlq),
        HELD_HEAD if f.kind == "waited" else None,
    )  # fmt: skip


def _payload(ev: Ev) -> dict[str, Any]:
    key = f"k{ev.offset_s}"
    if ev.event_type == "model_published":
        return {"model_id": key, "name": f"model {key}"}
    payload = {"vibe_id": key, "title": f"vibe {key}"}
    if ev.version == 2:
        payload["owner_id"] = "owner"
    return payload


async def _produce(conn: asyncpg.Connection, ev: Ev, occurred: datetime) -> None:
    """Declared events through the producer API; others as a non-Python producer would."""
    if ev.durable == "-":
        await conn.execute(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type,"
            " event_version, payload, occurred_at) VALUES ($1, 'thing', 'a', $2, $3, '{}', $4)",
            ev.id, ev.event_type, ev.version, occurred,
        )  # fmt: skip
        return
    await record_event(
        conn, aggregate_type="thing", aggregate_id=f"a{ev.offset_s}", event_type=ev.event_type,
        event_version=ev.version, payload=_payload(ev), event_id=ev.id, occurred_at=occurred,
    )  # fmt: skip


async def _write(world: KpiWorld, events: list[Ev], base: datetime, window_seconds: int) -> None:
    conns = {c: await asyncpg.connect(world.dsn(c)) for c in ("sea", "vibespro")}
    try:
        for context, conn in conns.items():
            mine = [e for e in events if e.context == context]
            async with conn.transaction():
                for ev in mine:
                    await _produce(conn, ev, ev.occurred(base, window_seconds))
            published = [e.id for e in mine if e.fate.kind != "unpublished"]
            await conn.execute(
                "UPDATE outbox_events SET published_at = occurred_at + $2 * interval '1 ms',"
                " publish_attempts = 1 WHERE id = ANY($1::uuid[])",
                published,
                PUBLISH_MS,
            )
        seqs: dict[str, int] = defaultdict(int)
        for ev in events:
            if ev.durable == "-" or ev.fate.kind not in RECEIVED:
                continue
            seqs[ev.durable] += 1
            target = conns[TARGET_OF[ev.durable]]
            occurred = ev.occurred(base, window_seconds)
            await target.execute(_INBOX, *_inbox_args(ev, occurred, seqs[ev.durable]))
            if ev.fate.kind in DEAD:
                at = occurred + timedelta(seconds=30)
                status = "replayed" if ev.fate.kind == "replayed" else "held"
                await target.execute(
                    _DEAD_LETTER, ev.durable, ev.id, f"{ev.context.upper()}_EVENTS",
                    seqs[ev.durable], ev.subject, ev.event_type, ev.version, ev.fate.dead_reason,
                    "handler said no", len(ev.fate.retries) + 1, json.dumps({"reason": "x"}),
                    f"{TARGET_OF[ev.durable]}.dlq.{ev.durable}", "consumer", at, status,
                )  # fmt: skip
            if ev.fate.kind in ("parked", "held"):
                state = "held" if ev.fate.kind == "held" else "queued"
                await target.execute(
                    _PARKED, ev.durable, seqs[ev.durable], ev.id, ev.subject, state,
                    ev.fate.dead_reason,
                )  # fmt: skip
    finally:
        for conn in conns.values():
            await conn.close()


def load(world: KpiWorld, events: list[Ev], base: datetime, window_seconds: int) -> None:
    """Write ``events`` into the world's databases."""
    asyncio.run(_write(world, events, base, window_seconds))


# ---- the expectation, from the specs alone


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q * 100, method="linear")) if values else None


def _expect_group(evs: list[Ev]) -> dict[str, Any]:
    kinds = [e.fate.kind for e in evs]
    done = [e for e in evs if e.fate.kind in PROCESSED]
    own = [float(e.fate.latency_ms) for e in done
           if e.fate.kind not in WAITED and e.fate.latency_ms is not None]  # fmt: skip
    waited = [float(e.fate.latency_ms) for e in done
              if e.fate.kind in WAITED and e.fate.latency_ms is not None]  # fmt: skip
    received = [e for e in evs if e.fate.kind in RECEIVED]
    lags = [e.fate.lag() for e in received]
    subscribed = all(e.durable != "-" for e in evs)
    places = dict.fromkeys(PLACE_COLUMN.values(), 0)
    if subscribed:
        for kind in kinds:
            if kind in PLACE_COLUMN:
                places[PLACE_COLUMN[kind]] += 1
    return {
        "produced": len(evs),
        "published": sum(k != "unpublished" for k in kinds),
        "received": len(received),
        "processed": len(done),
        "dead_lettered": sum(k in DEAD for k in kinds),
        "handler_409": sum(e.fate.handler_status == 409 for e in done),
        "duplicate_deliveries": sum(e.fate.duplicates for e in evs),
        "retries": sum(len(e.fate.retries) for e in received),
        "attempts": sum(e.fate.attempts() for e in received),
        **places,
        "waited": len(waited),
        "latency_p50_ms": _percentile(own, 0.5),
        "latency_p95_ms": _percentile(own, 0.95),
        "latency_p99_ms": _percentile(own, 0.99),
        "latency_max_ms": max(own) if own else None,
        "lag_p50_ms": _percentile(lags, 0.5),
        "lag_max_ms": max(lags) if lags else None,
        "waited_latency_p99_ms": _percentile(waited, 0.99),
        "waited_latency_max_ms": max(waited) if waited else None,
    }


def expected(
    events: list[Ev], base: datetime, window_seconds: int
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """(window_start, context, durable, subject) → expected counts and measures."""
    groups: dict[tuple[Any, ...], list[Ev]] = defaultdict(list)
    for ev in events:
        start = base + timedelta(seconds=ev.window * window_seconds)
        groups[(start, ev.context, ev.durable, ev.subject)].append(ev)
        groups[(start, ev.context, ev.durable, "*")].append(ev)
    return {key: _expect_group(evs) for key, evs in groups.items()}


def expected_totals(events: list[Ev]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(context, durable, subject) → expected counts over the whole dataset."""
    groups: dict[tuple[str, str, str], list[Ev]] = defaultdict(list)
    for ev in events:
        groups[(ev.context, ev.durable, ev.subject)].append(ev)
        groups[(ev.context, ev.durable, "*")].append(ev)
    return {key: _expect_group(evs) for key, evs in groups.items()}
