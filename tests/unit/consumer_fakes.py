"""In-memory stand-ins for the inbox consumer's ports, for its stages' unit tests.

* :data:`FakeHandler` — :class:`shared.domain.ports.HandlerPort`: the in-memory adapter
  :class:`shared.adapters.memory_handler.ScriptedHandler` (answers from a script per message id,
  or a default; records every call);
* :class:`MemoryInbox` — :class:`shared.domain.ports.InboxStore`: the in-memory adapter
  :class:`shared.adapters.memory_inbox.MemoryInboxStore` on a clock that stands still, with
  what the tests look at (each row, the retries);
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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from services.inbox_consumer.breaker import CircuitBreaker
from services.inbox_consumer.loop import ConsumerLoop
from services.inbox_consumer.metrics import ConsumerMetrics
from services.inbox_consumer.stats import ConsumerStats
from services.inbox_consumer.throttle import Throttle
from services.inbox_consumer.wiring import ConsumerConfig, assemble
from shared.adapters.memory_handler import ScriptedHandler
from shared.adapters.memory_inbox import MemoryInboxRow, MemoryInboxStore
from shared.contracts.topology import DurableSpec, read_topology
from shared.domain.ack import HandlerResponse, RetryPolicy
from shared.domain.envelope import Envelope
from shared.domain.ports import FailedAttempt
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


#: The handler port's in-memory adapter (answers from a script, records every call).
FakeHandler = ScriptedHandler


#: The durable the consumers of :func:`consumer` claim for.
DURABLE = "d"
#: The fakes' inbox clock stands still: a lease lasts until the test changes it.
NOW = 1000.0


class MemoryInbox(MemoryInboxStore):
    """The in-memory inbox adapter (held to the InboxStore contract suite), on a clock
    that stands still, with the retries recorded and each row by message id."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: NOW)
        self.retries: list[uuid.UUID] = []

    def row(self, message_id: uuid.UUID) -> MemoryInboxRow:
        """The row of ``message_id`` in :data:`DURABLE`."""
        return self.rows[(DURABLE, message_id)]

    def lease(self, message_id: uuid.UUID, owner: str, seconds: float) -> None:
        """Make ``message_id`` claimed by ``owner`` for ``seconds`` more."""
        self.rows[(DURABLE, message_id)] = MemoryInboxRow(
            "s", "processing", 1, datetime.now(UTC), owner, NOW + seconds
        )

    async def mark_retrying(
        self, conn: object, durable: str, message_id: uuid.UUID, attempt: FailedAttempt
    ) -> None:
        await super().mark_retrying(conn, durable, message_id, attempt)
        self.retries.append(message_id)


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
        durable=DURABLE,
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
        breaker=CircuitBreaker(spec.circuit_breaker, durable=DURABLE),
    )
    return ConsumerLoop(parts)
