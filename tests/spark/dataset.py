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

Kind = Literal["processed", "dead", "unreceived", "stuck", "unpublished"]
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
    """The main dataset: every fate, an empty window, a p99 breach, a lost event."""
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
  reason_code, duplicates, retry_history, dlq_metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16::jsonb, $17::jsonb)
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
    attempts = len(f.retries) + (0 if f.kind == "stuck" else 1)
    processed_at, status, handler, reason = None, "retrying", 503, (f.retries or (None,))[-1]
    dlq: dict[str, Any] | None = None
    if f.kind == "processed":
        assert f.latency_ms is not None
        processed_at = occurred + timedelta(milliseconds=f.latency_ms)
        status, handler = "processed", f.handler_status
    elif f.kind == "dead":
        status, handler, reason = "failed", 422, f.dead_reason
        history.append(_entry(attempts, received + timedelta(seconds=attempts), str(reason), 422))
        dlq = {"reason": reason, "replay_attempts": 0}
    return (
        ev.id, ev.durable, ev.subject, received, processed_at, attempts,
        None if status == "processed" else "failed", status, ev.event_type, ev.version,
        occurred, seq, handler, reason, f.duplicates, json.dumps(history),
        None if dlq is None else json.dumps(dlq),
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
            if ev.durable == "-" or ev.fate.kind in ("unreceived", "unpublished"):
                continue
            seqs[ev.durable] += 1
            target = conns[TARGET_OF[ev.durable]]
            occurred = ev.occurred(base, window_seconds)
            await target.execute(_INBOX, *_inbox_args(ev, occurred, seqs[ev.durable]))
            if ev.fate.kind == "dead":
                at = occurred + timedelta(seconds=30)
                await target.execute(
                    _DEAD_LETTER, ev.durable, ev.id, f"{ev.context.upper()}_EVENTS",
                    seqs[ev.durable], ev.subject, ev.event_type, ev.version, ev.fate.dead_reason,
                    "handler said no", len(ev.fate.retries) + 1, json.dumps({"reason": "x"}),
                    f"{TARGET_OF[ev.durable]}.dlq.{ev.durable}", "consumer", at, "held",
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
    done = [e for e in evs if e.fate.kind == "processed"]
    latencies = [float(e.fate.latency_ms) for e in done if e.fate.latency_ms is not None]
    received = [e for e in evs if e.fate.kind in ("processed", "dead", "stuck")]
    lags = [e.fate.lag() for e in received]
    subscribed = all(e.durable != "-" for e in evs)
    return {
        "produced": len(evs),
        "published": sum(k != "unpublished" for k in kinds),
        "received": len(received),
        "processed": len(done),
        "dead_lettered": kinds.count("dead"),
        "handler_409": sum(e.fate.handler_status == 409 for e in done),
        "duplicate_deliveries": sum(e.fate.duplicates for e in evs),
        "retries": sum(len(e.fate.retries) for e in received),
        "attempts": sum(len(e.fate.retries) + (e.fate.kind != "stuck") for e in received),
        "lost_candidates": sum(k in ("unreceived", "stuck") for k in kinds) if subscribed else 0,
        "latency_p50_ms": _percentile(latencies, 0.5),
        "latency_p95_ms": _percentile(latencies, 0.95),
        "latency_p99_ms": _percentile(latencies, 0.99),
        "latency_max_ms": max(latencies) if latencies else None,
        "lag_p50_ms": _percentile(lags, 0.5),
        "lag_max_ms": max(lags) if lags else None,
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
