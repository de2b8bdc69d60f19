"""``ferry durable rewind``: re-deliver a range of a durable's stream to that durable alone.

    ferry durable rewind [--topology FILE] --durable NAME (--since TIME | --from-seq N)
                         [--until TIME | --until-seq N] [--dry-run] --reason WHY [--actor WHO]

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
   Publishes are pipelined: up to :data:`WINDOW` PubAcks in flight.
4. The rewind is audited in ``durable_rewinds`` (migration 0011) in the durable's target
   database: the row is written when it starts and completed when it ends, so one that
   was interrupted stays visible as ``running`` (or ``interrupted``/``failed``).

What a rewind does *not* do: revive a dead letter (its inbox row is final: the copy counts
as a duplicate; ``ferry dlq replay`` does that) or un-hold the key of an ``ordering: key``
durable that a held dead letter blocks (the copies of its key wait behind it, as any of its
events would).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import re
import socket
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from shared.adapters.nats import connect_nats
from shared.adapters.postgres import Conn, connect
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.durations import parse_duration
from shared.domain.errors import ConfigurationError, MalformedInput, TransientError
from shared.domain.ordering import OrderingKeyError, all_partitions_filter, split_partition
from shared.domain.subjects import REPLAY_PREFIX, REWIND_HEADER
from shared.runtime.settings import CommonSettings

Command = Callable[[CommonSettings, argparse.Namespace], Coroutine[Any, Any, int]]
Progress = Callable[[int, int], None]

#: Copies whose PubAck may be outstanding at once.
WINDOW = 1000
#: Seconds a copy's PubAck may take before the copy is published again (same Nats-Msg-Id:
#: a copy that did land is dropped as a duplicate).
ACK_TIMEOUT = 10.0
#: Messages read before their copies are published (one socket write for all of them).
READ_BATCH = 256
#: Attempts at one copy's publish before the rewind fails.
PUBLISH_ATTEMPTS = 4
#: Seconds the reading consumer may go without a message while the range is not done.
STALL_TIMEOUT = 30.0
#: Copied from the original message when present.
_KEPT_HEADERS = ("traceparent", "tracestate", "Ferry-Ordering-Key")
_NATIVE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")


class RewindRefused(ConfigurationError):
    """The rewind was refused before anything was published (the message says why)."""


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


# --------------------------------------------------------------------------- the range


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time with its timezone (``2026-11-26T17:00:00Z``), or a duration ago
    (``2h``, ``90m``, ``1d``); :class:`MalformedInput` otherwise. A time without a timezone
    is refused: whose clock it means cannot be guessed."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedInput("a time must be ISO-8601 with a timezone or a duration ago (2h)")
    text = text.strip()
    now = now or datetime.now(UTC)
    if not _NATIVE_TIME.match(text):
        try:
            seconds = parse_duration(text)
        except MalformedInput:
            raise MalformedInput(
                f"{text[:60]!r} is neither an ISO-8601 time with a timezone nor a duration "
                "ago such as 2h"
            ) from None
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise MalformedInput(f"{text[:60]!r} reaches before year 1") from None
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise MalformedInput(f"{text[:60]!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise MalformedInput(f"{text[:60]!r} has no timezone: add Z or an offset like +01:00")
    return moment.astimezone(UTC)


def check_range(
    *,
    since: datetime | None,
    from_seq: int | None,
    until: datetime | None,
    until_seq: int | None,
    now: datetime,
) -> None:
    """Refuse a range that makes no sense (:class:`RewindRefused`), before any I/O."""
    if (since is None) == (from_seq is None):
        raise RewindRefused("give exactly one start: --since TIME or --from-seq N")
    if until is not None and until_seq is not None:
        raise RewindRefused("give at most one end: --until TIME or --until-seq N")
    for name, moment in (("--since", since), ("--until", until)):
        if moment is not None and moment.tzinfo is None:
            raise RewindRefused(f"{name} needs a timezone")
    if since is not None and since > now:
        raise RewindRefused(f"--since {since.isoformat()} is in the future (now {now.isoformat()})")
    if from_seq is not None and from_seq < 1:
        raise RewindRefused(f"--from-seq must be 1 or more, not {from_seq}")
    if until_seq is not None and until_seq < 1:
        raise RewindRefused(f"--until-seq must be 1 or more, not {until_seq}")
    if since is not None and until is not None and until < since:
        raise RewindRefused(f"--until {until.isoformat()} is before --since {since.isoformat()}")
    if from_seq is not None and until_seq is not None and until_seq < from_seq:
        raise RewindRefused(f"--until-seq {until_seq} is before --from-seq {from_seq}")


@dataclass(frozen=True)
class Kept:
    """What a stream still keeps."""

    first_seq: int
    last_seq: int
    #: When the first kept message was stored (None: the stream is empty).
    first_time: datetime | None

    def describe(self) -> str:
        if self.first_time is None:
            return f"the stream is empty (its next sequence is {self.last_seq + 1})"
        return (
            f"the stream keeps sequences {self.first_seq}..{self.last_seq}, the first stored "
            f"at {self.first_time.isoformat()}"
        )


def check_kept(stream: str, kept: Kept, *, since: datetime | None, from_seq: int | None) -> None:
    """Refuse a start older than what the stream keeps: part of the range is gone. A
    stream that still holds its sequence 1 has lost nothing, whatever ``since`` says."""
    if kept.first_seq <= 1:
        return
    if from_seq is not None and from_seq < kept.first_seq:
        raise RewindRefused(
            f"--from-seq {from_seq} is older than what {stream} keeps: {kept.describe()}; "
            f"sequences {from_seq}..{kept.first_seq - 1} are gone (max_age, max_bytes or "
            "deleted), so they cannot be re-delivered from the stream"
        )
    if since is not None and (kept.first_time is None or since < kept.first_time):
        raise RewindRefused(
            f"--since {since.isoformat()} is older than what {stream} keeps: "
            f"{kept.describe()}; what was stored before is gone (max_age, max_bytes or "
            "deleted), so it cannot be re-delivered from the stream"
        )


def durable_filters(topology: Topology, durable: str) -> list[str]:
    """The subjects the rewind reads: the durable's event filters, each widened to every
    partition on a partitioned stream (never its replay subject)."""
    spec = topology.durable(durable)
    stream = topology.stream_of(durable)
    filters = list(spec.filter_subjects)
    if stream.partitions > 1:
        namespace = topology.namespace_of_stream(spec.stream)
        filters = [all_partitions_filter(f, namespace) for f in filters]
    return list(dict.fromkeys(f for f in filters if not f.startswith(REPLAY_PREFIX + ".")))


# --------------------------------------------------------------------------- stream reads


async def _at_or_after(js: JetStreamContext, stream: str, seq: int) -> Any | None:
    """The first stored message at or after ``seq`` (None: none)."""
    try:
        return await js.get_msg(stream, seq=max(seq, 1), next=True)
    except NotFoundError:
        return None


async def kept_of(js: JetStreamContext, stream: str) -> Kept:
    """What ``stream`` keeps now."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        raise RewindRefused(f"stream {stream} does not exist (run `ferry provision`)") from None
    state = info.state
    first = int(state.first_seq)
    last = int(state.last_seq)
    if not state.messages:
        return Kept(first, last, None)
    msg = await _at_or_after(js, stream, first)
    return Kept(first, last, msg.time if msg is not None else None)


async def first_seq_at(js: JetStreamContext, stream: str, kept: Kept, moment: datetime) -> int:
    """The first sequence stored at or after ``moment`` (``kept.last_seq + 1``: none), by a
    binary search on stored times (JetStream stamps messages in sequence order)."""
    low, high = kept.first_seq, kept.last_seq + 1
    while low < high:
        middle = (low + high) // 2
        msg = await _at_or_after(js, stream, middle)
        if msg is None or msg.seq > high - 1:
            high = middle
        elif msg.time >= moment:
            high = middle  # nothing is stored between middle and msg.seq
        else:
            low = int(msg.seq) + 1
    return low


async def _next_match(
    js: JetStreamContext, stream: str, filters: list[str], seq: int
) -> int | None:
    """The first sequence at or after ``seq`` that one of ``filters`` takes (None: none)."""
    found = []
    for subject in filters:
        try:
            msg = await js.get_msg(stream, seq=max(seq, 1), subject=subject, next=True)
        except NotFoundError:
            continue
        if msg.seq is not None:
            found.append(int(msg.seq))
    return min(found, default=None)


# --------------------------------------------------------------------------- audit


_START = """
INSERT INTO durable_rewinds (id, durable, stream, since, from_seq, until, until_seq, stop_seq,
                             dry_run, actor, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
"""

_FINISH = """
UPDATE durable_rewinds
SET first_seq = $2, last_seq = $3, selected = $4, published = $5, skipped = $6,
    by_subject = $7::jsonb, outcome = $8, error = $9, finished_at = clock_timestamp()
WHERE id = $1
"""


@dataclass
class _Tally:
    first_seq: int | None = None
    last_seq: int | None = None
    selected: int = 0
    published: int = 0
    skipped: int = 0
    by_subject: Counter[str] = field(default_factory=Counter)

    def seen(self, seq: int, subject: str) -> None:
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq
        self.selected += 1
        self.by_subject[subject] += 1


async def _finish(
    conn: Conn, rewind_id: uuid.UUID, tally: _Tally, outcome: str, error: str | None
) -> None:
    await conn.execute(
        _FINISH,
        rewind_id,
        tally.first_seq,
        tally.last_seq,
        tally.selected,
        tally.published,
        tally.skipped,
        json.dumps(dict(sorted(tally.by_subject.items()))),
        outcome,
        error,
    )


# --------------------------------------------------------------------------- publishing


class _Publisher:
    """Copies on the replay subject: up to :data:`WINDOW` PubAcks in flight, settled oldest
    first; a copy unconfirmed after :data:`ACK_TIMEOUT` is published again under its
    Nats-Msg-Id.

    Its own reply subscription rather than ``js.publish_async``: that one waits on a
    semaphore through ``asyncio.wait_for`` and so yields to the event loop after every
    message, which wakes the client's flusher for one socket write each; here the copies
    of a whole read batch leave in one write.
    """

    def __init__(
        self, nc: NATS, js: JetStreamContext, stream: str, tally: _Tally, progress: Any
    ) -> None:
        self.nc, self.js, self.stream, self.tally, self.progress = nc, js, stream, tally, progress
        self.window: deque[tuple[asyncio.Future[Any], str, bytes, dict[str, str]]] = deque()
        self.waiting: dict[str, asyncio.Future[Any]] = {}
        self.prefix = ""
        self.count = 0
        self.sub: Any = None

    async def start(self) -> None:
        self.prefix = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.prefix + ".*", cb=self._acked)

    async def close(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()
        for future in self.waiting.values():
            future.cancel()

    async def _acked(self, msg: Any) -> None:
        future = self.waiting.pop(msg.subject.rpartition(".")[2], None)
        if future is None or future.done():
            return
        if (msg.headers or {}).get("Status") == "503":
            future.set_exception(TransientError(f"no stream answers on {self.stream}"))
            return
        try:
            doc = json.loads(msg.data)
        except ValueError:
            doc = {"error": {"description": f"unreadable PubAck {msg.data[:100]!r}"}}
        if isinstance(doc, dict) and "error" not in doc:
            future.set_result(doc.get("seq"))
        else:
            error = doc.get("error") if isinstance(doc, dict) else doc
            future.set_exception(TransientError(f"the stream refused a copy: {error}"))

    async def send(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        self.count += 1
        token = str(self.count)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        wire = {**headers, "Nats-Expected-Stream": self.stream}
        await self.nc.publish(subject, body, reply=f"{self.prefix}.{token}", headers=wire)
        window = self.window
        window.append((future, subject, body, headers))
        while window and (len(window) >= WINDOW or window[0][0].done()):
            await self._settle(window.popleft())

    async def flush(self) -> None:
        while self.window:
            await self._settle(self.window.popleft())
        self.progress()

    async def _settle(self, sent: tuple[asyncio.Future[Any], str, bytes, dict[str, str]]) -> None:
        future, subject, body, headers = sent
        if not future.done():
            await asyncio.wait([future], timeout=ACK_TIMEOUT)
        if future.done() and not future.cancelled() and future.exception() is None:
            self.tally.published += 1
            self.progress()
            return
        if not future.done():
            future.cancel()
        await self._again(subject, body, headers)

    async def _again(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        """Publish one copy until acknowledged (same Nats-Msg-Id: never twice in the stream
        within its duplicate window)."""
        last: BaseException | None = None
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                await self.js.publish(
                    subject, body, headers=headers, stream=self.stream, timeout=ACK_TIMEOUT
                )
            except Exception as exc:  # retried, then raised
                last = exc
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            self.tally.published += 1
            return
        seq = headers.get("Ferry-Original-Seq", "?")
        raise TransientError(
            f"could not publish the copy of sequence {seq} on {subject} after "
            f"{PUBLISH_ATTEMPTS} attempts: {last}"
        )


def _copy_headers(rewind_id: uuid.UUID, original: str, msg: Any, seq: int) -> dict[str, str]:
    headers = {
        "Nats-Msg-Id": f"rewind:{rewind_id}:{original}",
        REWIND_HEADER: str(rewind_id),
        "Ferry-Original-Subject": str(msg.subject),
        "Ferry-Original-Seq": str(seq),
    }
    for name in _KEPT_HEADERS:
        value = (msg.headers or {}).get(name)
        if value:
            headers[name] = value
    return headers


def _envelope_of(data: bytes) -> dict[str, Any] | None:
    """The envelope document when it names a message id (the inbox key); None otherwise."""
    try:
        doc = json.loads(data)
        uuid.UUID(str(doc["message_id"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return doc if isinstance(doc, dict) else None


# --------------------------------------------------------------------------- the rewind


async def rewind(
    settings: CommonSettings,
    topology: Topology,
    nc: NATS,
    *,
    durable: str,
    since: datetime | None = None,
    from_seq: int | None = None,
    until: datetime | None = None,
    until_seq: int | None = None,
    dry_run: bool = False,
    actor: str,
    reason: str,
    progress: Progress | None = None,
) -> RewindResult:
    """Re-deliver a range of ``durable``'s stream to ``durable`` alone (module doc).

    ``progress(done, selected)`` is called as the rewind goes (``done``: copies published,
    or messages counted for a dry run). Raises :class:`RewindRefused` (a
    :class:`ConfigurationError`) before publishing anything when the range is refused.
    """
    spec = topology.durable(durable)  # ConfigurationError naming the known ones
    if not reason.strip():
        raise RewindRefused("a rewind needs a reason (--reason)")
    if not actor.strip():
        raise RewindRefused("a rewind needs an actor (--actor)")
    check_range(since=since, from_seq=from_seq, until=until, until_seq=until_seq,
                now=datetime.now(UTC))  # fmt: skip
    js = nc.jetstream()
    stream = spec.stream
    kept = await kept_of(js, stream)
    check_kept(stream, kept, since=since, from_seq=from_seq)
    if from_seq is not None:
        start = from_seq
    else:
        assert since is not None  # check_range: exactly one start
        start = await first_seq_at(js, stream, kept, since)
    stop = kept.last_seq if until_seq is None else min(until_seq, kept.last_seq)
    if until is not None:
        stop = min(
            stop, await first_seq_at(js, stream, kept, until + timedelta(microseconds=1)) - 1
        )
    rewind_id = uuid.uuid4()
    tally = _Tally()
    began = time.monotonic()
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        await conn.execute(_START, rewind_id, durable, stream, since, from_seq, until,
                           until_seq, stop, dry_run, actor, reason)  # fmt: skip
        try:
            rewinder = _Rewinder(topology, nc, durable, rewind_id, dry_run=dry_run,
                                 tally=tally, progress=progress)  # fmt: skip
            await rewinder.run(start, stop)
        except asyncio.CancelledError:
            await asyncio.shield(_finish(conn, rewind_id, tally, "interrupted", "cancelled"))
            raise
        except BaseException as exc:
            task = asyncio.current_task()  # a cancel that surfaced as another error
            outcome = "interrupted" if task is not None and task.cancelling() else "failed"
            await asyncio.shield(_finish(conn, rewind_id, tally, outcome, repr(exc)[:1000]))
            raise
        await _finish(conn, rewind_id, tally, "done", None)
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


class _Rewinder:
    """Reads the range with an ordered consumer and publishes each selected message's copy."""

    def __init__(
        self,
        topology: Topology,
        nc: NATS,
        durable: str,
        rewind_id: uuid.UUID,
        *,
        dry_run: bool,
        tally: _Tally,
        progress: Progress | None,
    ) -> None:
        js = nc.jetstream()
        self.topology, self.js, self.durable = topology, js, durable
        self.stream = topology.durable(durable).stream
        self.rewind_id, self.dry_run, self.tally = rewind_id, dry_run, tally
        self.progress = progress
        plans = topology.consumers(durable)
        #: Whether copies go to the partition of their ordering key.
        self.partitioned = len(plans) > 1
        self.plain_subject = plans[0].replay_subject
        self.publisher = _Publisher(nc, js, self.stream, tally, self.report)
        self.last_report = 0.0

    def report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self.last_report >= 0.25:
            self.last_report = now
            tally = self.tally
            self.progress(tally.selected if self.dry_run else tally.published, tally.selected)

    async def run(self, start: int, stop: int) -> None:
        """Every message of ``start..stop`` the durable's filters take."""
        filters = durable_filters(self.topology, self.durable)
        first = await _next_match(self.js, self.stream, filters, start) if start <= stop else None
        if first is None or first > stop:
            return
        config = js_api.ConsumerConfig(
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=first,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
        )
        sub = await self.js.subscribe(
            filters[0], stream=self.stream, ordered_consumer=True, config=config
        )
        await self.publisher.start()
        try:
            done = False
            while not done:
                for msg in await self._batch(sub, stop):
                    seq = int(msg.metadata.sequence.stream)
                    if seq > stop:
                        done = True
                        break
                    if not msg.subject.startswith(REPLAY_PREFIX + "."):
                        await self._take(msg, seq)
                    if seq >= stop or int(msg.metadata.num_pending) == 0:
                        done = True
                        break
            await self.publisher.flush()
        finally:
            await sub.unsubscribe()
            await self.publisher.close()
        self.report(force=True)

    async def _batch(self, sub: Any, stop: int) -> list[Any]:
        """The next message and those already buffered behind it (up to :data:`READ_BATCH`):
        no copy is published while they are read, so a batch's copies leave together."""
        batch = [await self._next(sub, stop)]
        while sub.pending_msgs > 0 and len(batch) < READ_BATCH:
            batch.append(await self._next(sub, stop))
        return batch

    async def _next(self, sub: Any, stop: int) -> Any:
        try:
            msg = await sub.next_msg(timeout=STALL_TIMEOUT)
        except TimeoutError:
            raise TransientError(
                f"no message from {self.stream} for {STALL_TIMEOUT:.0f}s while rewinding "
                f"{self.durable} (last sequence read: {self.tally.last_seq}, stop at {stop})"
            ) from None
        # next_msg awaits a task of its own: a cancel that lands as the message arrives is
        # swallowed there (the task returns the message). It stays requested on ours.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        return msg

    async def _take(self, msg: Any, seq: int) -> None:
        """Count one selected message and (unless a dry run) publish its copy."""
        tally = self.tally
        tally.seen(seq, split_partition(msg.subject)[0])
        data = bytes(msg.data)
        envelope = _envelope_of(data)
        subject = None if envelope is None else self._replay_subject(envelope)
        if envelope is None or subject is None:
            tally.skipped += 1
            return
        if self.dry_run:
            if tally.selected % 1000 == 0:
                self.report()
            return
        original = (msg.headers or {}).get("Nats-Msg-Id") or str(envelope["message_id"])
        headers = _copy_headers(self.rewind_id, original, msg, seq)
        await self.publisher.send(subject, data, headers)

    def _replay_subject(self, envelope: dict[str, Any]) -> str | None:
        """Where the copy goes (None: an ordered durable's event without its key)."""
        if not self.partitioned:
            return self.plain_subject
        try:
            return self.topology.replay_subject_for(self.durable, envelope)
        except OrderingKeyError:
            return None


# --------------------------------------------------------------------------- the command


def _when(text: str) -> datetime:
    try:
        return parse_when(text)
    except MalformedInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream sequence") from None
    if value < 1:
        raise argparse.ArgumentTypeError("a stream sequence is 1 or more")
    return value


def _text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


class _Meter:
    """A progress line on stderr about once a second."""

    def __init__(self, dry_run: bool, every: float = 1.0) -> None:
        self.began = time.monotonic()
        self.last = self.began
        self.every = every
        self.verb = "counted" if dry_run else "published"

    def __call__(self, done: int, selected: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.began, 1e-9)
        print(f"rewind: {self.verb} {done}/{selected} selected ({rate:,.0f}/s)",
              file=sys.stderr, flush=True)  # fmt: skip


async def cmd_rewind(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Re-deliver a range of the durable's stream to it alone, through its replay subject."""
    topology = (
        load_topology(Path(args.topology), registry=settings.registry)
        if args.topology
        else settings.load_topology()
    )
    topology.durable(args.durable)
    actor = args.actor or f"{getpass.getuser()}@{socket.gethostname()}"
    nc = await connect_nats(
        settings.nats_servers(), name="ferry-rewind", auth=settings.nats_auth(), give_up_after=10
    )
    try:
        result = await rewind(
            settings,
            topology,
            nc,
            durable=args.durable,
            since=args.since,
            from_seq=args.from_seq,
            until=args.until,
            until_seq=args.until_seq,
            dry_run=args.dry_run,
            actor=actor,
            reason=args.reason,
            progress=None if args.json else _Meter(args.dry_run),
        )
    finally:
        await nc.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return 0
    span = (
        f"sequences {result.first_seq}..{result.last_seq}"
        if result.first_seq is not None
        else "nothing in the range"
    )
    if result.dry_run:
        print(f"dry run {result.rewind_id}: {result.selected} would be re-delivered to "
              f"{result.durable} ({span}, {result.skipped} without an envelope to carry); "
              "nothing published")  # fmt: skip
    else:
        print(f"rewind {result.rewind_id}: {result.published} of {result.selected} selected "
              f"re-delivered to {result.durable} ({span}, {result.skipped} skipped) in "
              f"{result.seconds:.1f}s, {result.rate:,.0f}/s")  # fmt: skip
    for subject, count in result.by_subject.items():
        print(f"  {count:>8}  {subject}")
    return 0


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register ``ferry durable rewind`` on the ``ferry`` parser's subcommands."""
    durable: argparse.ArgumentParser | None = getattr(sub, "choices", {}).get("durable")
    if durable is None:  # the group is shared (``ferry durable throttle`` joins it)
        durable = sub.add_parser("durable", help="operations on one durable")
        verbs = durable.add_subparsers(dest="durable_command", required=True)
    else:
        verbs = next(a for a in durable._actions if isinstance(a, argparse._SubParsersAction))
    rw = verbs.add_parser(
        "rewind",
        help="re-deliver a range of the durable's stream to it alone (its inbox counts what "
        "it processed as duplicates)",
    )
    rw.add_argument("--topology", help="topology file (default: FERRY_TOPOLOGY)")
    rw.add_argument("--durable", required=True, help="the durable to re-deliver to")
    # One of them is needed: checked with the range (check_range), exit 2 either way.
    start = rw.add_mutually_exclusive_group()
    start.add_argument(
        "--since",
        type=_when,
        help="from this time: ISO-8601 with a timezone, or a duration ago (2h)",
    )
    start.add_argument("--from-seq", type=_seq, help="from this stream sequence")
    end = rw.add_mutually_exclusive_group()
    end.add_argument("--until", type=_when, help="up to this time (default: now)")
    end.add_argument("--until-seq", type=_seq, help="up to this stream sequence (inclusive)")
    rw.add_argument("--dry-run", action="store_true", help="count what would be re-delivered")
    rw.add_argument("--reason", required=True, type=_text, help="why (recorded in the audit)")
    rw.add_argument("--actor", type=_text, help="who (default: OS user@host)")
    rw.add_argument("--json", action="store_true", help="machine-readable output")
    rw.set_defaults(func=cmd_rewind)
    return durable
