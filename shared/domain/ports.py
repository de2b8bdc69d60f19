"""Ports: what the roles need from a store or a transport, with the contract in the doc.

Each port is a :class:`typing.Protocol`; the PostgreSQL and NATS adapters implement them
(:mod:`shared.adapters.stores`, :mod:`shared.adapters.transport`), and
``tests/contracts/`` holds one suite per port, written against the port and run against
every implementation a fixture lists — the suite a second backend (or a fake) must pass.

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
from typing import Any, Literal, Protocol, TypeVar
from uuid import UUID

from shared.domain.ack import HandlerFailure, HandlerResponse, Outcome
from shared.domain.batch_call import BatchAnswer, MalformedAnswer

#: The connection (transaction handle) a store works on; asyncpg's for PostgreSQL.
ConnT_contra = TypeVar("ConnT_contra", contravariant=True)
#: What a dead-letter store records (the adapter's ``Failure``).
FailureT_contra = TypeVar("FailureT_contra", contravariant=True)


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
        self,
        conn: ConnT_contra,
        durable: str,
        message_id: UUID,
        *,
        error: str,
        status: int | None,
        reason_code: str,
        history_entry: dict[str, Any],
    ) -> None:
        """No final outcome yet: release the lease, remember why."""
        ...

    async def backlog(self, conn: ConnT_contra, durable: str) -> Mapping[str, Any]:
        """Rows without a final outcome: ``count``, ``retrying``, ``failed`` and ages."""
        ...


# --- dead letters ---------------------------------------------------------------------


DeadLetterOutcome = Literal["recorded", "already"]


class DeadLetterStore(Protocol[ConnT_contra, FailureT_contra]):
    """Dead-letter records: one per ``(durable, message_id)``, whatever path reports it.

    Contract (``tests/contracts/test_dead_letter_store.py``):

    * ``record`` stores a failure once: a second report of the same message (the
      consumer's 422 and the advisory of the same message, two router replicas) is
      ``already`` and changes nothing (**deduplicated**);
    * the record says whether it will be replayed automatically (``dead``), is held for
      an operator (``held``: operator policy, or a defect of the bytes themselves), or
      hit the replay cap (``parked``);
    * ``set_status`` moves a record to ``parked`` or ``discarded`` only from a status
      that allows it, and answers False otherwise; repeating it is harmless;
    * ``settle_replayed`` marks replays the consumer has since processed as
      ``replayed``; a second call finds nothing left (**idempotent**).
    """

    async def record(self, conn: ConnT_contra, failure: FailureT_contra) -> DeadLetterOutcome:
        """Record ``failure`` once; ``already`` when another path did."""
        ...

    async def status(self, conn: ConnT_contra, durable: str, message_id: UUID) -> str | None:
        """The record's status, or None when there is none."""
        ...

    async def set_status(
        self,
        conn: ConnT_contra,
        *,
        durable: str,
        message_id: UUID,
        status: Literal["parked", "discarded"],
        actor: str,
        reason: str,
    ) -> bool:
        """Park or discard one dead letter (the action recorded); False if not allowed."""
        ...

    async def settle_replayed(self, conn: ConnT_contra, durables: Sequence[str]) -> int:
        """Mark replays that were processed as ``replayed``; how many."""
        ...


# --- event transport ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishReceipt:
    """What the stream answered to one publish."""

    stream: str
    seq: int
    #: True when the message id was already in the stream's duplicate window.
    duplicate: bool


class Delivery(Protocol):
    """One delivery of a message to a durable; settle it exactly once."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def stream_seq(self) -> int: ...

    async def ack(self) -> None:
        """Done: never delivered to this durable again."""
        ...

    async def nak(self, delay: float) -> None:
        """Not now: delivered again after ``delay`` seconds, ``attempt`` one higher."""
        ...

    async def term(self) -> None:
        """Never again (dead-lettered elsewhere): not redelivered."""
        ...


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


class EventTransport(Protocol):
    """A durable, ordered log of events per stream, read through named durables.

    Contract (``tests/contracts/test_event_transport.py``, Watermill's universal tests):

    * ``publish`` is **durable once it returns** and **idempotent per message id**: a
      second publish with the same ``message_id`` inside the duplicate window is
      acknowledged with ``duplicate=True`` and not stored (nor delivered) twice;
    * a durable receives a stream's messages **in publish order**, each at least once;
    * an unsettled or ``nak``-ed delivery is **redelivered** (after the nak's delay, or
      the ack wait), with ``attempt`` one higher; an ``ack``-ed or ``term``-ed one is not;
    * ``fetch`` waits at most ``timeout`` and returns ``[]`` when nothing is pending
      (no message is not an error);
    * two durables of one stream each receive every message.
    """

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        message_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishReceipt:
        """Store ``data`` under ``subject``; durable once it returns."""
        ...

    async def fetch(self, durable: str, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` deliveries for ``durable``, in stream order; [] if none."""
        ...


# --- event handler --------------------------------------------------------------------


#: What a batch call came to: per-event results, an unreadable answer, or one outcome
#: for every event (a non-200 answer, a timeout, no connection).
BatchOutcome = BatchAnswer | MalformedAnswer | HandlerResponse | HandlerFailure


class HandlerPort(Protocol):
    """A durable's event handler (PORT-047-005): one event per call, or N in a batch call.

    Contract: **nothing raises** for the handler's sake. Every failure to get an answer
    (a timeout, no connection) is a :class:`~shared.domain.ack.HandlerFailure`, every
    answer a :class:`~shared.domain.ack.HandlerResponse`; a batch call's 200 is its
    per-event results (:class:`~shared.domain.batch_call.BatchAnswer`) or a
    :class:`~shared.domain.batch_call.MalformedAnswer`. The caller turns each outcome
    into a decision (:func:`shared.domain.ack.decide`). ``services.inbox_consumer.
    dispatch.HttpHandler`` is the HTTP adapter.
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
