"""The sweep: dead letters for exhaustion that no advisory ever reported.

The dlq-router learns that JetStream gave up on a message from its MAX_DELIVERIES
advisory. An advisory is a core NATS message: when it is not captured (the advisory
stream was unavailable, a subject was missing, the advisory was deleted), the inbox row
stays ``retrying`` for good, with no dead letter and no alert. The sweep closes that gap.

Every ``sweep_interval`` the router looks, per durable, for inbox rows without a final
outcome that nobody touched past the durable's redelivery horizon
(:func:`shared.domain.dead_letter.redelivery_horizon`) — or, for a row whose last
delivery (``max_deliver``) failed, past ``spent_after`` seconds only: JetStream delivers
it no more, and a late advisory finds the sweep's record and adds nothing, so there is
nothing to wait for but the advisory's usual second (issue 44: a lost advisory left its
event to the horizon, dead-lettered 7 minutes later) — and whose message JetStream will
not deliver again (:func:`shared.domain.dead_letter.may_still_be_delivered`, from the
durable's consumer info). Each is dead-lettered with reason
``DELIVERY_EXHAUSTED_UNREPORTED`` through the same
:func:`~shared.adapters.dead_letters.record_dead_letter` as every other path, so a late
advisory finds the record and adds nothing.

Replicas: each row is re-checked under ``FOR UPDATE SKIP LOCKED`` in its own transaction,
so two routers sweeping at once never both take a row, and the dead-letter row's primary
key makes a second record impossible anyway.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from shared.adapters import dead_letters, inbox
from shared.adapters.jetstream import NOT_FOUND_ERRORS, JetStream
from shared.adapters.postgres import Pool
from shared.contracts.topology import DurableSpec, Topology, subject_matches
from shared.domain.dead_letter import (
    SWEEP_REASON,
    DurableProgress,
    may_still_be_delivered,
    redelivery_horizon,
)
from shared.domain.envelope import identify
from shared.domain.ordering import split_partition

log = logging.getLogger("ferry.dlq_router.sweep")

#: Rows looked at per durable per sweep.
BATCH = 200
#: Seconds a row whose last delivery failed waits for its advisory before the sweep.
SPENT_AFTER = 30.0


@dataclass
class SweepStats:
    """Counters of the sweep (exported with the router's)."""

    sweeps: int = 0
    recorded: int = 0
    already: int = 0
    still_pending: int = 0
    errors: int = 0


def dead_letter_stream(topology: Topology, subject: str) -> str | None:
    """The dead-letter stream that captures ``subject``, if the topology declares one."""
    for stream in topology.dead_letter_streams:
        if any(subject_matches(pattern, subject) for pattern in stream.subjects):
            return stream.name
    return None


class Sweep:
    """Dead-letters one topology's unreported exhaustions (see the module doc)."""

    def __init__(
        self,
        *,
        topology: Topology,
        pools: dict[str, Pool],
        js: JetStream,
        margin: float,
        errors: tuple[type[BaseException], ...],
        on_recorded: Any = None,
        spent_after: float = SPENT_AFTER,
    ) -> None:
        self.topology, self.pools, self.js, self.margin = topology, pools, js, margin
        self.spent_after = spent_after
        self.errors = errors
        self.on_recorded = on_recorded
        self.stats = SweepStats()

    def horizon(self, spec: DurableSpec) -> float:
        """The durable's redelivery horizon, in seconds."""
        return redelivery_horizon(
            ack_wait=spec.ack_wait,
            max_deliver=spec.max_deliver,
            backoff=spec.backoff,
            margin=self.margin,
        )

    async def run_once(self) -> int:
        """One sweep over every durable; how many dead letters it recorded."""
        self.stats.sweeps += 1
        recorded = 0
        for name, spec in sorted(self.topology.durables.items()):
            try:
                recorded += await self.sweep_durable(name, spec)
            except self.errors as exc:
                self.stats.errors += 1
                log.warning("sweep of %s failed (%s); next sweep tries again", name, exc)
        return recorded

    async def _progress(self, name: str, spec: DurableSpec) -> dict[int | None, DurableProgress]:
        """Each consumer's progress, by partition (None: the durable's only consumer)."""
        progress: dict[int | None, DurableProgress] = {}
        for plan in self.topology.consumers(name):
            try:
                info = await self.js.consumer_info(spec.stream, plan.name)
            except NOT_FOUND_ERRORS:
                log.warning("consumer %s of %s is not provisioned; not swept", plan.name, name)
                return {}
            progress[plan.partition] = DurableProgress(
                ack_floor=info.ack_floor.stream_seq if info.ack_floor else 0,
                delivered=info.delivered.stream_seq if info.delivered else 0,
                ack_pending=int(info.num_ack_pending or 0),
            )
        return progress

    async def sweep_durable(self, name: str, spec: DurableSpec) -> int:
        """Sweep one durable; how many dead letters it recorded."""
        progress = await self._progress(name, spec)
        if not progress:
            return 0
        horizon = self.horizon(spec)
        wait = inbox.SweepWait(horizon, spec.max_deliver, self.spent_after)
        recorded = 0
        pool = self.pools[self.topology.context(spec.target).database]
        async with pool.acquire() as conn:
            for row in await inbox.unreported(conn, name, wait, BATCH):
                # A partition's consumer knows only its own messages: the partition is the
                # message's last subject token in the stream (the inbox keeps the event's
                # subject without it); if the message is gone, any consumer may have it.
                partition = None
                if len(progress) > 1:
                    partition = await self._partition(spec.stream, row["stream_seq"])
                known = progress.get(partition)
                candidates = [known] if known is not None else list(progress.values())
                if any(
                    may_still_be_delivered(
                        stream_seq=row["stream_seq"],
                        attempts=row["attempts"],
                        replayed=row["replayed"],
                        progress=seen,
                        max_deliver=spec.max_deliver,
                    )
                    for seen in candidates
                ):
                    self.stats.still_pending += 1
                    continue
                try:
                    recorded += await self._dead_letter(conn, name, spec, row["message_id"], wait)
                except self.errors as exc:
                    self.stats.errors += 1
                    log.warning("could not sweep %s/%s (%s)", name, row["message_id"], exc)
        return recorded

    async def _partition(self, stream: str, seq: int) -> int | None:
        """The partition token of the message at ``seq`` (None: gone, or no token)."""
        try:
            msg = await self.js.get_msg(stream, seq)
        except NOT_FOUND_ERRORS:
            return None
        return split_partition(msg.subject or "")[1]

    async def _dead_letter(
        self,
        conn: Any,
        name: str,
        spec: DurableSpec,
        message_id: uuid.UUID,
        wait: inbox.SweepWait,
    ) -> int:
        async with conn.transaction():
            row = await inbox.lock_unreported(conn, name, message_id, wait)
            if row is None:  # settled meanwhile, or another replica holds it
                return 0
            untouched = wait.spent_after if row["attempts"] >= spec.max_deliver else wait.horizon
            failure = await self._failure(name, spec, row, min(untouched, wait.horizon))
            outcome = await dead_letters.record_dead_letter(
                conn,
                self.js,
                failure,
                spec,
                dlq_stream=dead_letter_stream(self.topology, spec.dead_letter_subject),
            )
        if outcome == "already":
            self.stats.already += 1
            return 0
        self.stats.recorded += 1
        if self.on_recorded is not None:
            self.on_recorded(name, failure)
        log.warning(
            "dead-lettered an exhaustion no advisory reported",
            extra={"durable": name, "message_id": str(message_id), "reason": SWEEP_REASON},
        )
        return 1

    async def _failure(
        self, name: str, spec: DurableSpec, row: dict[str, Any], horizon: float
    ) -> dead_letters.Failure:
        payload, envelope = await self._original(spec.stream, row["stream_seq"])
        last = row["last_error"] or "no outcome recorded"
        return dead_letters.Failure(
            durable=name,
            message_id=row["message_id"],
            stream=spec.stream,
            stream_seq=row["stream_seq"],
            original_subject=row["subject"],
            reason_code=SWEEP_REASON,
            last_error=(
                f"{last} (untouched for over {horizon:.0f}s and no longer pending in "
                "JetStream; no MAX_DELIVERIES advisory was recorded)"
            ),
            attempts=int(row["attempts"] or 0),
            payload=payload,
            retry_history=list(row["retry_history"]),
            source="sweep",
            event_type=row["event_type"] or (envelope.event_type if envelope else None),
            event_version=row["event_version"],
            occurred_at=row["occurred_at"],
            traceparent=row["traceparent"],
            handler_status=row["handler_status"],
        )

    async def _original(self, stream: str, seq: int) -> tuple[Any, Any]:
        """The original's payload to keep (envelope dict, else raw text) and envelope."""
        try:
            msg = await self.js.get_msg(stream, seq)
        except NOT_FOUND_ERRORS:
            return None, None
        data: bytes = msg.data or b""
        found = identify(
            data,
            subject=msg.subject or "",
            msg_id_header=(msg.headers or {}).get("Nats-Msg-Id"),
            stream=stream,
            seq=seq,
        )
        if found.envelope is not None:
            return found.envelope.to_dict(), found.envelope
        return data.decode("utf-8", "replace"), None
