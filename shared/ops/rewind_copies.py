"""The copies of a rewind (``ferry durable rewind``, :mod:`shared.ops.rewind`): the
:class:`Rewinder` reads the range with an ordered consumer and publishes each selected
message's copy on the durable's replay subject, through a pipelined publisher."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from shared.adapters.jetstream import JetStream, from_sequence
from shared.adapters.nats import NatsClient
from shared.contracts.topology import Topology
from shared.domain.errors import TransientError
from shared.domain.ordering import OrderingKeyError, split_partition
from shared.domain.subjects import REPLAY_PREFIX, REWIND_HEADER
from shared.ops.rewind_audit import Tally
from shared.ops.rewind_range import durable_filters, next_match

#: ``progress(done, selected)``, called as a rewind goes.
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
        self, nc: NatsClient, js: JetStream, stream: str, tally: Tally, progress: Any
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


# --------------------------------------------------------------------------- reading the range


class Rewinder:
    """Reads the range with an ordered consumer and publishes each selected message's copy."""

    def __init__(
        self,
        topology: Topology,
        nc: NatsClient,
        durable: str,
        rewind_id: uuid.UUID,
        *,
        dry_run: bool,
        tally: Tally,
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
        first = await next_match(self.js, self.stream, filters, start) if start <= stop else None
        if first is None or first > stop:
            return
        config = from_sequence(first, filters)
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
