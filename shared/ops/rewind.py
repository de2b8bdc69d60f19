"""Rewinding a durable: re-deliver a range of its stream to that durable alone (``ferry
durable rewind``, shared/cli/rewind.py; the restore drill).

What it is for: a durable's target database was restored from a backup (or a handler lost
what it applied) and the events processed since must reach it again — without touching the
other durables of the stream, which processed them and must not see them twice.

How (the *replay path*, as ``ferry dlq replay`` uses it):

1. The range is turned into stream sequences: ``--since``/``--until`` by a binary search
   on the stored messages' times; the rewind never reads past the stream's last sequence
   as it was when it started (or ``--until-seq``), so it ends even while events flow in.
   A range starting before what the stream still keeps is refused, naming what is left.
2. A temporary *ordered* consumer (ephemeral, in memory, unacknowledged) reads the range,
   filtered to the durable's own filter subjects — never the ``ferry.replay.*`` subjects.
3. Each message is published again, byte for byte, on the durable's replay subject
   (``ferry.replay.{STREAM}.{durable}``, or the partition of its ordering key for an
   ``ordering: key`` durable: :meth:`Topology.replay_subject_for`), which only that
   durable's consumers read. The envelope keeps its ``message_id`` — the inbox key — so
   the durable's inbox makes it safe: what it processed is counted as a duplicate and
   acked without calling the handler, what it lost (a restored database) is processed.
   The copy's ``Nats-Msg-Id`` is ``rewind:{rewind_id}:{original id}`` (the stream's
   duplicate window would drop the original id; a retried publish of one copy is still
   dropped) and ``Ferry-Rewind: {rewind_id}`` tells it from a dead-letter replay.
   Publishes are pipelined: up to :data:`~shared.ops.rewind_copies.WINDOW` PubAcks in flight.
4. The rewind is audited in ``durable_rewinds`` (migration 0011) in the durable's target
   database: the row is written when it starts and completed when it ends, so one that
   was interrupted stays visible as ``running`` (or ``interrupted``/``failed``).

What a rewind does *not* do: revive a dead letter (its inbox row is final: the copy counts
as a duplicate; ``ferry dlq replay`` does that) or un-hold the key of an ``ordering: key``
durable that a held dead letter blocks (the copies of its key wait behind it, as any of its
events would).

Where the pieces live: the range in :mod:`shared.ops.rewind_range` (1), reading it and
publishing the copies in :mod:`shared.ops.rewind_copies` (2, 3), the audit in
:mod:`shared.ops.rewind_audit` (4); this module runs them (:func:`rewind`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.adapters.nats import NatsClient
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.ops.rewind_audit import START, Tally, finish
from shared.ops.rewind_copies import Progress, Rewinder
from shared.ops.rewind_range import (
    RewindRange,
    RewindRefused,
    check_kept,
    check_range,
    first_seq_at,
    kept_of,
)
from shared.runtime.settings import CommonSettings


@dataclass(frozen=True)
class RewindResult:
    """What one rewind did."""

    rewind_id: uuid.UUID
    durable: str
    stream: str
    #: First and last stream sequences selected (None: nothing selected).
    first_seq: int | None
    last_seq: int | None
    #: Messages of the range that the durable's filters take.
    selected: int
    #: Copies published (and acknowledged) on the replay subject; 0 for a dry run.
    published: int
    seconds: float
    #: Selected messages per event subject (without a partition token).
    by_subject: dict[str, int] = field(default_factory=dict)
    #: Selected messages not re-delivered: no envelope to carry (the consumer dead-lettered
    #: them already) or no ordering key to place them by.
    skipped: int = 0
    dry_run: bool = False
    #: The last stream sequence the rewind would read.
    stop_seq: int = 0

    @property
    def rate(self) -> float:
        """Messages per second (published, or selected for a dry run)."""
        done = self.selected if self.dry_run else self.published
        return done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``--json``)."""
        doc = asdict(self)
        doc["rewind_id"] = str(self.rewind_id)
        doc["rate"] = round(self.rate, 1)
        doc["seconds"] = round(self.seconds, 3)
        return doc


# --------------------------------------------------------------------------- the rewind


async def rewind(
    settings: CommonSettings,
    topology: Topology,
    nc: NatsClient,
    *,
    durable: str,
    span: RewindRange,
    dry_run: bool = False,
    actor: str,
    reason: str,
    progress: Progress | None = None,
) -> RewindResult:
    """Re-deliver ``span``, a range of ``durable``'s stream, to ``durable`` alone (module doc).

    ``progress(done, selected)`` is called as the rewind goes (``done``: copies published,
    or messages counted for a dry run). Raises :class:`RewindRefused` (a
    :class:`ConfigurationError`) before publishing anything when the range is refused.
    """
    spec = topology.durable(durable)  # ConfigurationError naming the known ones
    if not reason.strip():
        raise RewindRefused("a rewind needs a reason (--reason)")
    if not actor.strip():
        raise RewindRefused("a rewind needs an actor (--actor)")
    check_range(span, now=datetime.now(UTC))
    js = nc.jetstream()
    stream = spec.stream
    kept = await kept_of(js, stream)
    check_kept(stream, kept, span)
    if span.from_seq is not None:
        start = span.from_seq
    else:
        assert span.since is not None  # check_range: exactly one start
        start = await first_seq_at(js, stream, kept, span.since)
    stop = kept.last_seq if span.until_seq is None else min(span.until_seq, kept.last_seq)
    if span.until is not None:
        after_until = span.until + timedelta(microseconds=1)
        stop = min(stop, await first_seq_at(js, stream, kept, after_until) - 1)
    rewind_id = uuid.uuid4()
    tally = Tally()
    began = time.monotonic()
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        await conn.execute(
            START, rewind_id, durable, stream, span.since, span.from_seq, span.until,
            span.until_seq, stop, dry_run, actor, reason,
        )  # fmt: skip
        try:
            rewinder = Rewinder(topology, nc, durable, rewind_id, dry_run=dry_run,
                                tally=tally, progress=progress)  # fmt: skip
            await rewinder.run(start, stop)
        except asyncio.CancelledError:
            await asyncio.shield(finish(conn, rewind_id, tally, "interrupted", "cancelled"))
            raise
        except BaseException as exc:
            task = asyncio.current_task()  # a cancel that surfaced as another error
            outcome = "interrupted" if task is not None and task.cancelling() else "failed"
            await asyncio.shield(finish(conn, rewind_id, tally, outcome, repr(exc)[:1000]))
            raise
        await finish(conn, rewind_id, tally, "done", None)
    finally:
        await conn.close()
    return RewindResult(
        rewind_id=rewind_id,
        durable=durable,
        stream=stream,
        first_seq=tally.first_seq,
        last_seq=tally.last_seq,
        selected=tally.selected,
        published=tally.published,
        seconds=time.monotonic() - began,
        by_subject=dict(sorted(tally.by_subject.items())),
        skipped=tally.skipped,
        dry_run=dry_run,
        stop_seq=stop,
    )
