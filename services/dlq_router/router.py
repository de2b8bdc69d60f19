"""The dlq-router's behaviour: advisories in, dead-letter records out.

JetStream says a message will not be delivered again with two advisories: MAX_DELIVERIES
(every delivery failed, or nobody settled them: a consumer that crashed each time, a
handler slower than ack_wait) and MSG_TERMINATED (a consumer gave up on it). They are
core NATS messages, so the topology's advisory stream captures them and the router reads
that stream durably: a router that was down catches up when it is back.

For each advisory the router fetches the original message by stream sequence, joins the
inbox row of the durable's target database (last error, attempts, retry history) and
records the dead letter through :func:`shared.adapters.dead_letters.record_dead_letter`
— the same function the consumer's direct path uses, so one record per (durable,
message_id) whichever path came first. It acks the advisory only once that is done:

* inbox row processed  → nothing to record (the final delivery succeeded late); ack;
* inbox row leased     → the last delivery may still succeed; look again after the lease;
* database or NATS down, or no stream leader → nak with a delay; the advisory waits in
  its stream (it is acked only once settled, so nothing is lost);
* an advisory it cannot use (not JSON, unknown durable) → logged, counted, terminated;
  one that fails in an unexpected way → retried, then terminated after
  ``GIVE_UP_AFTER`` tries. No advisory ever ends the router.

Beside the advisories, the router sweeps for exhaustions no advisory reported
(:mod:`.sweep`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from services.dlq_router.metrics import RouterMetrics
from shared import telemetry
from shared.access.streams import ROUTER_DURABLE
from shared.adapters import dead_letters, inbox
from shared.adapters.jetstream import (
    NOT_FOUND_ERRORS,
    REQUEST_FAILED_ERRORS,
    REQUEST_TIMEOUT_ERRORS,
    JetStream,
    JetStreamMsg,
)
from shared.adapters.postgres import Pool
from shared.adapters.transient import TRANSIENT_ERRORS
from shared.contracts.topology import Topology
from shared.domain.envelope import SURROGATE_NAMESPACE, identify
from shared.domain.ordering import durable_of_consumer
from shared.runtime.metrics import RoleMetrics
from shared.waits import cancel_and_wait, sleep_unless

from .advisory import MAX_DELIVER_TYPE, TERMINATED_TYPE, Advisory, InvalidAdvisory
from .sweep import SPENT_AFTER, Sweep, dead_letter_stream

__all__ = ["MAX_DELIVER_TYPE", "TERMINATED_TYPE", "Advisory", "DlqRouter", "InvalidAdvisory"]

log = logging.getLogger("ferry.dlq_router")

#: Delays (seconds) before an advisory that could not be handled is offered again.
RETRY_DELAYS = (1.0, 5.0, 15.0, 60.0)
#: Transient (:data:`shared.adapters.transient.TRANSIENT_ERRORS`): the advisory is
#: nak'ed and comes back; nothing is lost.
ERRORS = TRANSIENT_ERRORS
#: A fetch of advisories that failed (closed, no responders, JetStream refusing, the
#: socket): logged, and fetched again after a pause.
_FETCH_FAILED: tuple[type[BaseException], ...] = (*REQUEST_FAILED_ERRORS, OSError)
#: A settlement of an advisory that failed: logged (the advisory comes back).
_SETTLE_FAILED: tuple[type[BaseException], ...] = (
    *REQUEST_FAILED_ERRORS,
    *REQUEST_TIMEOUT_ERRORS,
    OSError,
)
#: Deliveries after which an advisory that fails in an unexpected way is terminated (it
#: stays in the advisory stream for inspection; the sweep still catches its message).
GIVE_UP_AFTER = 10


@dataclass
class RouterStats:
    """Counters the role exposes (and tests read)."""

    advisories: int = 0
    recorded: int = 0
    already: int = 0
    processed_late: int = 0
    waiting: int = 0
    errors: int = 0
    invalid: int = 0
    failed: int = 0
    bound: bool = False
    recorded_by_reason: dict[str, int] = field(default_factory=dict)


class DlqRouter:
    """Turns one topology's captured advisories into dead-letter records."""

    def __init__(
        self,
        *,
        topology: Topology,
        pools: dict[str, Pool],
        js: JetStream,
        metrics: RouterMetrics | None = None,
        sweep_margin: float = 300.0,
        sweep_spent_after: float = SPENT_AFTER,
    ) -> None:
        self.topology, self.pools, self.js = topology, pools, js
        self.stats = RouterStats()
        self.sweep = Sweep(
            topology=topology,
            pools=pools,
            js=js,
            margin=sweep_margin,
            errors=ERRORS,
            on_recorded=self._swept,
            spent_after=sweep_spent_after,
        )
        self.metrics = metrics or RouterMetrics(RoleMetrics("dlq-router"))
        self.metrics.watch(self)

    async def run(
        self,
        stop: asyncio.Event,
        *,
        fetch_timeout: float,
        batch: int = 50,
        sweep_interval: float | None = None,
    ) -> None:
        """Handle advisories until ``stop``; the batch in hand is finished first. With
        ``sweep_interval``, sweep for unreported exhaustions that often (:mod:`.sweep`)."""
        sweeping = (
            asyncio.create_task(self._sweep_every(sweep_interval, stop)) if sweep_interval else None
        )
        try:
            await self._route_advisories(stop, fetch_timeout=fetch_timeout, batch=batch)
        finally:
            if sweeping is not None:
                await cancel_and_wait(sweeping)

    async def _sweep_every(self, interval: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_unless(stop, interval)
            if stop.is_set():
                return
            try:
                await self.sweep.run_once()
            except Exception:  # one sweep's surprise must not end the router
                self.sweep.stats.errors += 1
                log.exception("sweep failed; next sweep tries again")

    def _swept(self, durable: str, failure: dead_letters.Failure) -> None:
        self.metrics.dead_lettered(durable, failure.reason_code, failure.source)

    async def _route_advisories(
        self, stop: asyncio.Event, *, fetch_timeout: float, batch: int
    ) -> None:
        psub = await self.js.pull_subscribe_bind(
            durable=ROUTER_DURABLE, stream=self.topology.advisory_stream
        )
        self.stats.bound = True
        while not stop.is_set():
            try:
                msgs = await psub.fetch(batch, timeout=fetch_timeout)
            except REQUEST_TIMEOUT_ERRORS:
                continue
            except _FETCH_FAILED as exc:
                log.warning("fetch failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self.handle(msg)

    async def handle(self, msg: JetStreamMsg) -> None:
        """Handle one advisory message and settle it, in a ``process`` span of a new trace
        linked to the dead message's own (advisories carry no trace context)."""
        with telemetry.span_scope(
            f"process {msg.subject}",
            kind=telemetry.SpanKind.CONSUMER,
            root=True,
            attributes=telemetry.messaging_attributes(
                operation_type="process",
                operation_name="process",
                destination=msg.subject,
                consumer_group=ROUTER_DURABLE,
            ),
        ):
            await self._handle(msg)

    async def _handle(self, msg: JetStreamMsg) -> None:
        self.stats.advisories += 1
        try:
            advisory = Advisory.parse(msg.data)
        except InvalidAdvisory as exc:
            # Nothing in it can be recorded; keep it in the stream for inspection.
            self.stats.invalid += 1
            log.error("unusable advisory on %s (seq %s): %s", msg.subject, _seq(msg), exc)
            await _quiet(msg.term())
            return
        # A partitioned, ordered durable's advisories name one of its partition consumers
        # ({durable}_p{k}): dead letters, inbox rows and metrics are the durable's.
        durable = durable_of_consumer(advisory.durable, self.topology.durables)
        if durable is None:
            self.stats.invalid += 1
            log.error("advisory for %s, which is not in this topology", advisory.durable)
            await _quiet(msg.term())
            return
        advisory = replace(advisory, durable=durable)
        attempt = _delivered(msg)
        try:
            delay = await self._route(advisory)
        except ERRORS as exc:
            self.stats.errors += 1
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS)) - 1]
            log.warning("could not record %s (%s); again in %.0fs", _key(advisory), exc, delay)
        except Exception:  # this advisory's own problem: never the router's end
            self.stats.failed += 1
            if attempt >= GIVE_UP_AFTER:
                log.exception("giving up on advisory %s after %d tries", _key(advisory), attempt)
                await _quiet(msg.term())
                return
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS)) - 1]
            log.exception("advisory %s failed unexpectedly; again in %.0fs", _key(advisory), delay)
        if delay is None:
            await _quiet(msg.ack())
        else:
            await _quiet(msg.nak(delay=delay))

    async def _route(self, advisory: Advisory) -> float | None:
        """Record the dead letter; a delay when it must be looked at again later."""
        spec = self.topology.durables[advisory.durable]
        pool = self.pools[self.topology.context(spec.target).database]
        original = await self._original(advisory)
        if original is not None:
            telemetry.link_current((original.headers or {}).get("traceparent"))
        async with pool.acquire() as conn:
            message_id, envelope, payload, subject = await self._identify(conn, advisory, original)
            telemetry.annotate(
                messaging__message__id=str(message_id), ferry__durable=advisory.durable
            )
            row = await inbox.fetch_row(conn, advisory.durable, message_id)
            if row is not None and row["status"] == "processed":
                self.stats.processed_late += 1
                log.info("%s was processed after all; nothing to record", _key(advisory))
                return None
            if row is not None and row["status"] == "processing" and row["leased"]:
                self.stats.waiting += 1
                return float(row["lease_left"] or 0.0) + 1.0
            failure = _failure(advisory, message_id, envelope, payload, subject, row, original)
            outcome = await dead_letters.record_dead_letter(
                conn,
                self.js,
                failure,
                spec,
                dlq_stream=dead_letter_stream(self.topology, spec.dead_letter_subject),
            )
        if outcome == "already":
            self.stats.already += 1
        else:
            self.stats.recorded += 1
            by = self.stats.recorded_by_reason
            by[failure.reason_code] = by.get(failure.reason_code, 0) + 1
            self.metrics.dead_lettered(advisory.durable, failure.reason_code, failure.source)
            log.info(
                "dead-lettered",
                extra={
                    "durable": advisory.durable,
                    "message_id": str(message_id),
                    "reason": failure.reason_code,
                    "source": failure.source,
                },
            )
        return None

    async def _original(self, advisory: Advisory) -> Any | None:
        """The original message by stream sequence, or None when the stream dropped it."""
        try:
            return await self.js.get_msg(advisory.stream, advisory.stream_seq)
        except NOT_FOUND_ERRORS:
            return None

    async def _identify(
        self, conn: Any, advisory: Advisory, original: Any | None
    ) -> tuple[uuid.UUID, Any, Any, str]:
        """Key, envelope, payload to keep and the event's subject."""
        if original is not None:
            data: bytes = original.data or b""
            found = identify(
                data,
                subject=original.subject,
                msg_id_header=(original.headers or {}).get("Nats-Msg-Id"),
                stream=advisory.stream,
                seq=advisory.stream_seq,
            )
            if found.envelope is not None:
                env = found.envelope
                return found.message_id, env, env.to_dict(), env.subject
            return found.message_id, None, data.decode("utf-8", "replace"), original.subject
        # Gone from the stream (max_age): the inbox may still know which message it was.
        known = await conn.fetchrow(
            "SELECT message_id, subject FROM inbox_messages WHERE durable = $1 AND stream_seq = $2",
            advisory.durable,
            advisory.stream_seq,
        )
        if known is not None:
            return known["message_id"], None, None, known["subject"]
        surrogate = uuid.uuid5(SURROGATE_NAMESPACE, f"{advisory.stream}:{advisory.stream_seq}")
        return surrogate, None, None, ""


def _failure(
    advisory: Advisory,
    message_id: uuid.UUID,
    envelope: Any,
    payload: Any,
    subject: str,
    row: dict[str, Any] | None,
    original: Any | None,
) -> dead_letters.Failure:
    if advisory.kind == "max_deliveries":
        reason = "MAX_DELIVERIES_EXCEEDED"
        fallback = (
            f"no outcome recorded for any of {advisory.deliveries} deliveries "
            "(the consumer crashed or the handler outlived ack_wait)"
        )
    else:
        reason = (row or {}).get("reason_code") or "TERMINATED"
        fallback = advisory.reason or "a consumer terminated the message"
    if original is None:
        fallback += "; the original is no longer in the stream"
    headers = (original.headers or {}) if original is not None else {}
    return dead_letters.Failure(
        durable=advisory.durable,
        message_id=message_id,
        stream=advisory.stream,
        stream_seq=advisory.stream_seq,
        original_subject=subject,
        reason_code=reason,
        last_error=(row or {}).get("last_error") or fallback,
        attempts=max(advisory.deliveries, int((row or {}).get("attempts") or 0)),
        payload=payload,
        retry_history=list((row or {}).get("retry_history") or []),
        source=f"advisory:{advisory.kind}",  # type: ignore[arg-type]
        event_type=envelope.event_type if envelope else None,
        event_version=envelope.event_version if envelope else None,
        occurred_at=envelope.occurred_at if envelope else None,
        traceparent=headers.get("traceparent"),
        handler_status=(row or {}).get("handler_status"),
    )


def _key(advisory: Advisory) -> str:
    return f"{advisory.durable} {advisory.stream}#{advisory.stream_seq}"


def _delivered(msg: JetStreamMsg) -> int:
    try:
        return max(int(msg.metadata.num_delivered), 1)
    except (AttributeError, IndexError, ValueError, TypeError):  # not a JetStream delivery
        return 1


def _seq(msg: JetStreamMsg) -> Any:
    try:
        return msg.metadata.sequence.stream
    except (AttributeError, IndexError, ValueError):  # not a JetStream delivery
        return "?"


async def _quiet(ack: Any) -> None:
    try:
        await ack
    except _SETTLE_FAILED as exc:
        log.warning("could not settle advisory: %s", exc)
