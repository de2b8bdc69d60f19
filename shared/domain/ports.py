"""Ports: what the roles need from a store, a fetched message or a handler, with the
contract in the doc.

Each port is a :class:`typing.Protocol` that a role takes (the outbox-publisher its
:class:`OutboxStore`; the inbox-consumer its :class:`InboxStore`, :class:`HandlerPort`
and the :class:`MessageInHand` it settles). Every port has a real adapter and an
in-memory one:

* ``OutboxStore``, ``InboxStore``: PostgreSQL in :mod:`shared.adapters.stores`, memory in
  :mod:`shared.adapters.memory` and :mod:`shared.adapters.memory_inbox`;
* ``HandlerPort``: HTTP in ``services.inbox_consumer.dispatch.HttpHandler``, memory in
  :class:`shared.adapters.memory_handler.ScriptedHandler`;
* ``MessageInHand``: a JetStream message (or a parked copy), memory in the consumer's
  unit-test fakes (``tests/unit/consumer_fakes.FakeMsg``).

``tests/contracts/`` holds one suite per port (outbox, inbox, handler), written against
the port and run against every backend (the real one and the fake): the suite a new
backend must pass.

Stores take the caller's connection (``ConnT``) on every call, because their guarantees
are transactional: a claim holds its locks until the caller's transaction ends, and the
producer writes its outbox row inside the caller's own transaction. Only the standard
library (and the domain's own values) here, so the domain can name the ports without
knowing a driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from shared.domain.ack import HandlerFailure, HandlerResponse, Outcome
from shared.domain.batch_call import BatchAnswer, MalformedAnswer

#: The connection (transaction handle) a store works on; asyncpg's for PostgreSQL.
ConnT_contra = TypeVar("ConnT_contra", contravariant=True)


# --- outbox ---------------------------------------------------------------------------


class OutboxRecord(Protocol):
    """One claimed outbox row, as the publisher reads it."""

    @property
    def id(self) -> UUID: ...
    @property
    def seq(self) -> int: ...
    @property
    def aggregate(self) -> tuple[str, str]: ...
    @property
    def event_type(self) -> str: ...
    @property
    def event_version(self) -> int: ...
    @property
    def payload(self) -> str: ...
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def aggregate_type(self) -> str: ...
    @property
    def aggregate_id(self) -> str: ...
    @property
    def correlation_id(self) -> UUID | None: ...
    @property
    def causation_id(self) -> UUID | None: ...
    @property
    def traceparent(self) -> str | None: ...
    @property
    def tracestate(self) -> str | None: ...


class OutboxClaim(Protocol):
    """What one claim locked: the publishable rows and how many wait behind others."""

    @property
    def rows(self) -> Sequence[OutboxRecord]: ...
    @property
    def held_back(self) -> int: ...


class OutboxFailure(Protocol):
    """Why one row's publish failed (the adapter's ``outbox.Failure``).

    ``set_aside``: a reason code when the row can never be published as it is;
    ``outage``: the failure says nothing about the row (JetStream did not answer).
    """

    @property
    def error(self) -> str: ...
    @property
    def set_aside(self) -> str | None: ...
    @property
    def outage(self) -> bool: ...


class OutboxStore(Protocol[ConnT_contra]):
    """The outbox of one context: rows written with the state, published once each.

    Contract (``tests/contracts/test_outbox_store.py``):

    * ``claim`` runs inside the caller's transaction and locks what it returns until that
      transaction ends; claims of concurrent transactions are **disjoint** (a row is in
      at most one claim at a time), and a row whose transaction commits late is never
      skipped (no cursor);
    * rows come in commit-independent ``seq`` order, and a row is returned only when no
      earlier row of its aggregate is pending outside the claim (``held_back`` counts
      those that are not): per-aggregate order holds across claimers;
    * ``mark_published`` takes rows out of every later claim; marking a row twice, or no
      row, is harmless (**idempotent**);
    * ``mark_failed`` keeps a row pending but makes it wait out a back-off before it is
      claimed again (a row the stream refuses cannot spin); a row whose failure names a
      ``set_aside`` reason, or that the stream refused ``max_attempts`` times, is set
      aside: never claimed again (nor does it hold back its aggregate's later rows'
      claim candidates), and returned with its reason; an outage never sets a row aside;
    * ``backlog`` counts the pending rows (``count``, ``failing``, ``oldest_at``).
    """

    async def claim(self, conn: ConnT_contra, limit: int) -> OutboxClaim:
        """Lock up to ``limit`` candidates; the publishable ones (inside a transaction)."""
        ...

    async def mark_published(self, conn: ConnT_contra, seqs: Sequence[int]) -> None:
        """The rows ``seqs`` are in the stream: never claimed again."""
        ...

    async def mark_failed(
        self, conn: ConnT_contra, failures: Mapping[int, OutboxFailure], *, max_attempts: int
    ) -> Mapping[int, str]:
        """One failed attempt per row (its error kept); the rows set aside now, with why."""
        ...

    async def backlog(self, conn: ConnT_contra) -> Mapping[str, Any]:
        """Pending rows: ``count``, ``failing``, ``oldest_at``, ``max_attempts``."""
        ...

    async def mark_waiting(self, conn: ConnT_contra) -> int:
        """Housekeeping the publisher runs now and then: keep the rows waiting behind a
        set-aside row out of the claim's way (a store may do nothing). Changes no claim's
        result; the rows it marked or released."""
        ...


# --- inbox ----------------------------------------------------------------------------


class InboxDelivery(Protocol):
    """What the consumer knows of a delivery when it records it."""

    @property
    def message_id(self) -> UUID: ...
    @property
    def subject(self) -> str: ...
    @property
    def event_type(self) -> str | None: ...
    @property
    def event_version(self) -> int | None: ...
    @property
    def occurred_at(self) -> datetime | None: ...
    @property
    def stream_seq(self) -> int: ...
    @property
    def traceparent(self) -> str | None: ...


class InboxClaim(Protocol):
    """Per message id: claimed (with its attempt count), final (a duplicate), or leased."""

    @property
    def claimed(self) -> Mapping[UUID, int]: ...
    @property
    def final(self) -> set[UUID]: ...
    @property
    def leased(self) -> Mapping[UUID, float]: ...


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """Why an attempt failed, as the inbox row keeps it until the next (``mark_retrying``):
    the error, the handler's status (None: no answer), the reason code, and the entry added
    to the row's retry history."""

    error: str
    status: int | None
    reason_code: str
    history_entry: dict[str, Any]


class InboxStore(Protocol[ConnT_contra]):
    """The inbox of one durable: exactly-once processing over at-least-once delivery.

    Contract (``tests/contracts/test_inbox_store.py``):

    * ``claim_batch`` records each delivery once per ``(durable, message_id)`` and leases
      it to ``owner`` for ``lease_seconds``; a message is **claimed by one owner at a
      time** (another's claim inside the lease sees it as ``leased``, with the time left);
    * a message with a final outcome (processed or dead-lettered) is ``final`` on every
      later claim: a duplicate, never handed to the handler again;
    * a message marked retrying (no final outcome) is claimable again at once, its
      attempt count one higher;
    * ``mark_processed`` is **idempotent** (marking twice leaves one final row);
    * durables are independent: the same message id in two durables is two rows.
    """

    async def claim_batch(
        self,
        conn: ConnT_contra,
        *,
        durable: str,
        owner: str,
        lease_seconds: float,
        entries: Sequence[InboxDelivery],
    ) -> InboxClaim:
        """Record and lease ``entries`` (unique ids); classify those not claimed."""
        ...

    async def mark_processed(
        self, conn: ConnT_contra, durable: str, outcomes: Mapping[UUID, int]
    ) -> None:
        """Final outcome 'processed' for each id, with the handler's status."""
        ...

    async def mark_retrying(
        self, conn: ConnT_contra, durable: str, message_id: UUID, attempt: FailedAttempt
    ) -> None:
        """No final outcome yet: release the lease, remember why."""
        ...

    async def backlog(self, conn: ConnT_contra, durable: str) -> Mapping[str, Any]:
        """Rows in play and dead letters still open: ``count`` (their sum), ``retrying``,
        ``failed`` (dead-lettered, not settled since) and ages."""
        ...


# --- a fetched message ----------------------------------------------------------------


class MessageInHand(Protocol):
    """A fetched message as the consumer answers for it (the delivery port of its settle
    stage): a JetStream message, or a parked copy its drainer hands over.

    Exactly one of ``ack``, ``nak`` or ``term`` ends it (``is_acked`` is then True);
    ``in_progress`` until then resets the redelivery clock (ack_wait) without ending it.
    """

    @property
    def is_acked(self) -> bool: ...

    async def ack(self) -> None:
        """Done: never delivered to this durable again."""
        ...

    async def nak(self, delay: float | None = None) -> None:
        """Not now: delivered again after ``delay`` seconds."""
        ...

    async def term(self) -> None:
        """Never again (dead-lettered): not redelivered."""
        ...

    async def in_progress(self) -> None:
        """Still being worked on: not redelivered for another ack_wait."""
        ...


class Position(Protocol):
    """Where a message sits in its stream."""

    @property
    def stream(self) -> int: ...


class DeliveryMetadata(Protocol):
    """What JetStream says of one delivery."""

    @property
    def stream(self) -> str: ...

    @property
    def sequence(self) -> Position: ...

    @property
    def num_delivered(self) -> int: ...


class FetchedMessage(MessageInHand, Protocol):
    """A fetched message with its contents: what the consumer parses into a delivery
    (:class:`shared.adapters.jetstream_answers.Held`, or a parked copy)."""

    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    @property
    def metadata(self) -> DeliveryMetadata: ...


# --- event handler --------------------------------------------------------------------


#: What a batch call came to: per-event results, an unreadable answer, or one outcome
#: for every event (a non-200 answer, a timeout, no connection).
BatchOutcome = BatchAnswer | MalformedAnswer | HandlerResponse | HandlerFailure


class HandlerPort(Protocol):
    """A durable's event handler (PORT-047-005): one event per call, or N in a batch call.

    Contract (``tests/contracts/test_handler_port.py``): **nothing raises** for the
    handler's sake. Every failure to get an answer (a timeout, no connection) is a
    :class:`~shared.domain.ack.HandlerFailure`, every answer a
    :class:`~shared.domain.ack.HandlerResponse`; a batch call's 200 is its
    per-event results (:class:`~shared.domain.batch_call.BatchAnswer`) or a
    :class:`~shared.domain.batch_call.MalformedAnswer`. The caller turns each outcome
    into a decision (:func:`shared.domain.ack.decide`). ``services.inbox_consumer.
    dispatch.HttpHandler`` is the HTTP adapter, :class:`shared.adapters.
    memory_handler.ScriptedHandler` the in-memory one.
    """

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        """Hand one event (the request body) over; what came of it."""
        ...

    async def handle_batch(
        self, body: dict[str, Any], headers: dict[str, str], expected: list[UUID]
    ) -> BatchOutcome:
        """Hand a batch document carrying the events ``expected`` over; what came of it."""
        ...

    async def close(self) -> None:
        """Release the connections."""
        ...
