"""In-memory stand-ins for the inbox consumer's ports, for its stages' unit tests.

* :class:`FakeHandler` — :class:`shared.domain.ports.HandlerPort`: answers from a script
  per message id (or a default), records every call;
* :class:`MemoryInbox` — :class:`shared.domain.ports.InboxStore`: claims, duplicates,
  leases of other owners, processed and retrying rows, in a dict;
* :class:`FakeMsg` — a fetched message as the consumer settles it (ack / nak / term /
  in_progress, recorded), built from an envelope by :func:`fake_msg`;
* :class:`FakePool` — what :class:`~services.inbox_consumer.holding.Holder` acquires
  connections from; :attr:`FakePool.down` makes the next acquisitions fail as an outage.

:func:`consumer` assembles a whole consumer on them through the composition root
(:func:`services.inbox_consumer.wiring.assemble`): no server is started.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from services.inbox_consumer.loop import ConsumerLoop
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from services.inbox_consumer.wiring import ConsumerConfig, assemble
from shared.adapters.inbox import ClaimResult
from shared.contracts.topology import DurableSpec, read_topology
from shared.domain.ack import HandlerResponse, Outcome, RetryPolicy
from shared.domain.envelope import Envelope
from shared.domain.ports import BatchOutcome, InboxDelivery
from shared.runtime.metrics import RoleMetrics

ROOT = Path(__file__).resolve().parents[2]
OK = HandlerResponse(200)


@dataclass
class _Sequence:
    stream: int


@dataclass
class _Metadata:
    stream: str
    sequence: _Sequence
    num_delivered: int


@dataclass
class FakeMsg:
    """A fetched message; what was sent back for it is in :attr:`calls`."""

    subject: str
    data: bytes
    headers: dict[str, str] | None
    metadata: _Metadata
    is_acked: bool = False
    calls: list[str] = field(default_factory=list)
    delays: list[float | None] = field(default_factory=list)

    async def ack(self) -> None:
        self.is_acked = True
        self.calls.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.is_acked = True
        self.calls.append("nak")
        self.delays.append(delay)

    async def term(self) -> None:
        self.is_acked = True
        self.calls.append("term")

    async def in_progress(self) -> None:
        self.calls.append("in_progress")


def fake_msg(
    seq: int, *, attempt: int = 1, message_id: str | None = None, stream: str = "S"
) -> FakeMsg:
    """A well-formed event's delivery at stream position ``seq``."""
    env = Envelope(
        message_id=message_id or str(uuid.uuid4()),
        subject="vibespro.event.vibe_created.v1",
        context="vibespro",
        event_type="vibe_created",
        event_version=1,
        occurred_at=datetime.now(UTC),
        aggregate_type="vibe",
        aggregate_id=f"v{seq}",
        payload={"vibe_id": f"v{seq}", "title": "t"},
    )
    headers = {"Nats-Msg-Id": env.message_id}
    return FakeMsg(env.subject, env.to_wire(), headers, _Metadata(stream, _Sequence(seq), attempt))


@dataclass
class FakeHandler:
    """Answers each call from ``script`` (per message id, in order), else ``default``."""

    script: dict[str, list[Outcome]] = field(default_factory=dict)
    default: Outcome = OK
    calls: list[str] = field(default_factory=list)
    batches: list[list[uuid.UUID]] = field(default_factory=list)
    closed: bool = False

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        mid = headers["Idempotency-Key"]
        self.calls.append(mid)
        answers = self.script.get(mid)
        return answers.pop(0) if answers else self.default

    async def handle_batch(
        self, body: dict[str, Any], headers: dict[str, str], expected: list[uuid.UUID]
    ) -> BatchOutcome:
        self.batches.append(list(expected))
        return self.default  # one outcome for every event of the call

    async def close(self) -> None:
        self.closed = True


@dataclass
class _Row:
    state: str  # claimed, processed, retrying
    owner: str
    attempts: int
    status: int | None = None


@dataclass
class MemoryInbox:
    """The inbox of one durable in a dict (the contract of ``InboxStore``, in brief)."""

    rows: dict[uuid.UUID, _Row] = field(default_factory=dict)
    lease_left: float = 3.0
    retries: list[uuid.UUID] = field(default_factory=list)

    async def claim_batch(
        self,
        conn: object,
        *,
        durable: str,
        owner: str,
        lease_seconds: float,
        entries: Sequence[InboxDelivery],
    ) -> ClaimResult:
        claim = ClaimResult(claimed={}, final=set(), leased={})
        for entry in entries:
            row = self.rows.get(entry.message_id)
            if row is not None and row.state == "processed":
                claim.final.add(entry.message_id)
            elif row is not None and row.state == "claimed" and row.owner != owner:
                claim.leased[entry.message_id] = self.lease_left
            else:
                attempts = row.attempts + 1 if row is not None else 1
                self.rows[entry.message_id] = _Row("claimed", owner, attempts)
                claim.claimed[entry.message_id] = attempts
        return claim

    async def mark_processed(
        self, conn: object, durable: str, outcomes: Mapping[uuid.UUID, int]
    ) -> None:
        for mid, status in outcomes.items():
            self.rows[mid].state, self.rows[mid].status = "processed", status

    async def mark_retrying(
        self,
        conn: object,
        durable: str,
        message_id: uuid.UUID,
        *,
        error: str,
        status: int | None,
        reason_code: str,
        history_entry: dict[str, Any],
    ) -> None:
        self.rows[message_id].state, self.rows[message_id].status = "retrying", status
        self.retries.append(message_id)

    async def backlog(self, conn: object, durable: str) -> Mapping[str, Any]:
        pending = [r for r in self.rows.values() if r.state != "processed"]
        return {"count": len(pending), "retrying": 0, "failed": 0, "oldest_at": None}


@dataclass
class FakePool:
    """Hands out a dummy connection; ``down`` acquisitions fail first, as an outage."""

    down: int = 0
    acquired: int = 0

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        if self.down > 0:
            self.down -= 1
            raise ConnectionRefusedError("the database is away")
        self.acquired += 1
        yield object()


def durable_spec(name: str = "cg_replay", **fields: Any) -> DurableSpec:
    """A durable of the shipped mediation topology, with ``fields`` changed."""
    topo = read_topology(ROOT / "topologies/mediation.yaml")
    return topo.durables[name].model_copy(update=fields)


def consumer(
    spec: DurableSpec,
    *,
    handler: FakeHandler,
    inbox: MemoryInbox,
    pool: FakePool | None = None,
    owner: str = "me",
) -> ConsumerLoop:
    """A consumer assembled by the composition root on the fakes (no JetStream: only
    its stages and :meth:`~ConsumerLoop.process_batch` are for use)."""
    config = ConsumerConfig(
        durable="d",
        spec=spec,
        owner=owner,
        concurrency=4,
        lease_seconds=5.0,
        policy=RetryPolicy((0.5, 1.0), 3, 5.0),
        accepted=None,
    )
    parts = assemble(
        config,
        pool=cast(Any, pool or FakePool()),
        js=cast(Any, None),
        handler=handler,
        store=cast(Any, inbox),
        stats=ConsumerStats(),
        metrics=ConsumerMetrics(RoleMetrics("inbox-consumer"), durable="d", stream=spec.stream),
        throttle=Throttle("d", spec),
    )
    return ConsumerLoop(parts)
