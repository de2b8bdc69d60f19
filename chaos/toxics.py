"""Toxics: what they are (a validated spec) and what they do to one direction of one connection.

A connection through a proxy has two *links*: ``upstream`` carries client → server bytes,
``downstream`` server → client. Each link is a chain of :class:`Stage` objects joined by
queues, like Toxiproxy's: the head is always a no-op, every toxic of the link's direction
adds a stage at the tail, and toxics added or removed later are spliced into the chains of
connections that already exist.

Semantics follow upstream Toxiproxy (see docs/how-to/run-chaos.md):

``latency``      each chunk leaves ``latency`` ± ``jitter`` ms after it was read (order kept)
``timeout``      drop every byte; close the connection after ``timeout`` ms (0: never).
                 Removing it closes the connections it blackholed: their streams lost data.
``reset_peer``   on the first bytes, wait ``timeout`` ms, then reset (TCP RST) both sides
``bandwidth``    at most ``rate`` KB/s (1 KB = 1000 bytes; 0 = unlimited)
``slow_close``   hold the end of the stream back by ``delay`` ms
``limit_data``   let ``bytes`` bytes through, then close the connection
``slicer``       cut chunks into ``average_size`` ± ``size_variation`` byte slices,
                 ``delay`` microseconds apart

``toxicity`` is the probability that the toxic acts on a given connection; the dice are
rolled when the toxic joins the connection (at connect time, or when the toxic is added).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.waits import cancel_and_wait, within

#: The two directions of a connection.
STREAMS = ("upstream", "downstream")


class ToxicError(ValueError):
    """A toxic spec that cannot be used; the message names the offending field."""


@dataclass(frozen=True)
class Attribute:
    """One integer attribute of a toxic type."""

    name: str
    minimum: int = 0
    unit: str = ""


#: Toxic type → its attributes (all integers; an absent one is 0, as upstream).
TOXIC_TYPES: dict[str, tuple[Attribute, ...]] = {
    "latency": (Attribute("latency", unit="ms"), Attribute("jitter", unit="ms")),
    "timeout": (Attribute("timeout", unit="ms"),),
    "reset_peer": (Attribute("timeout", unit="ms"),),
    "bandwidth": (Attribute("rate", unit="KB/s"),),
    "slow_close": (Attribute("delay", unit="ms"),),
    "limit_data": (Attribute("bytes"),),
    "slicer": (
        Attribute("average_size", minimum=1),
        Attribute("size_variation"),
        Attribute("delay", unit="us"),
    ),
}


@dataclass
class ToxicSpec:
    """A toxic as the API shows it."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        """The API representation (every field, the attributes copied)."""
        return asdict(self)


def parse_toxic(doc: object) -> ToxicSpec:
    """Validate a create-toxic body; raise :class:`ToxicError` naming the first defect."""
    if not isinstance(doc, dict):
        raise ToxicError("bad request body: expected a JSON object")
    toxic_type = doc.get("type")
    if toxic_type not in TOXIC_TYPES:
        known = ", ".join(sorted(TOXIC_TYPES))
        raise ToxicError(f"invalid toxic type: {toxic_type!r} (known types: {known})")
    stream = doc.get("stream", "downstream")
    if stream not in STREAMS:
        raise ToxicError(
            f"stream was invalid, can be either upstream or downstream (got {stream!r})"
        )
    name = doc.get("name") or f"{toxic_type}_{stream}"
    if not isinstance(name, str):
        raise ToxicError(f"name must be a string, got {name!r}")
    return ToxicSpec(
        name=name,
        type=toxic_type,
        stream=stream,
        toxicity=parse_toxicity(doc.get("toxicity", 1.0)),
        attributes=parse_attributes(toxic_type, doc.get("attributes") or {}, {}),
    )


def parse_toxicity(value: object) -> float:
    """A probability in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ToxicError(f"toxicity must be a number between 0 and 1, got {value!r}")
    return float(value)


def parse_attributes(toxic_type: str, raw: object, current: Mapping[str, int]) -> dict[str, int]:
    """``raw`` over ``current`` (an update keeps what it does not name), checked."""
    if not isinstance(raw, dict):
        raise ToxicError(f"attributes must be an object, got {raw!r}")
    spec = {a.name: a for a in TOXIC_TYPES[toxic_type]}
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise ToxicError(
            f"{toxic_type} has no attribute(s) {', '.join(unknown)} (known: {', '.join(spec)})"
        )
    values = {name: current.get(name, 0) for name in spec}
    for name, value in raw.items():
        values[name] = _integer(toxic_type, spec[name], value)
    for name, attribute in spec.items():
        if values[name] < attribute.minimum:
            raise ToxicError(
                f"{toxic_type}: attributes.{name} must be >= {attribute.minimum}, "
                f"got {values[name]}"
            )
    if toxic_type == "slicer" and values["size_variation"] >= values["average_size"]:
        raise ToxicError(
            "slicer: attributes.size_variation must be smaller than attributes.average_size"
        )
    return values


def _integer(toxic_type: str, attribute: Attribute, value: object) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        unit = f" ({attribute.unit})" if attribute.unit else ""
        raise ToxicError(
            f"{toxic_type}: attributes.{attribute.name}{unit} must be a non-negative integer, "
            f"got {value!r}"
        )
    return value


@dataclass
class Chunk:
    """Bytes read from a link's source, stamped with the loop time they were read at."""

    data: bytes
    at: float


#: ``None`` in a queue marks the end of the stream.
Item = Chunk | None


@dataclass
class Stage:
    """One toxic's place in one link of one connection.

    ``held`` is what the running toxic has taken from ``input`` but not yet passed on;
    when the toxic is interrupted (removed or updated), the link passes it on, so no byte
    is lost by reconfiguring ("don't drop data on the floor", as upstream says).
    """

    spec: ToxicSpec | None
    output: asyncio.Queue[Item]
    hooks: LinkHooks
    rng: random.Random
    input: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    held: list[Item] = field(default_factory=list)
    state: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    active: bool = True
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Roll the toxicity dice and run the toxic (or a no-op) on this stage."""
        self.active = self.spec is None or self.rng.random() < self.spec.toxicity
        runner = RUNNERS[self.spec.type] if self.spec and self.active else run_noop
        self.task = asyncio.create_task(runner(self))

    async def stop(self) -> None:
        """Interrupt the toxic; what it held stays in ``held``."""
        if self.task is not None and not self.task.done():
            await cancel_and_wait(self.task)

    async def take(self) -> Item:
        """The next item, remembered in ``held`` until emitted or dropped."""
        item = await self.input.get()
        self.held = [item]
        return item

    def emit(self, item: Item) -> None:
        """Pass ``item`` on to the next stage (or the writer)."""
        self.output.put_nowait(item)
        self.held = []

    def drop(self, chunk: Chunk) -> None:
        """Throw ``chunk`` away (its bytes no longer count against the link's buffer)."""
        self.hooks.dropped(len(chunk.data))
        self.held = []

    def close(self) -> None:
        """End the stream here: what follows is discarded and the connection closes."""
        self.closed = True
        self.held = []
        self.output.put_nowait(None)

    def attributes(self) -> dict[str, int]:
        """The toxic's attributes (empty for the head no-op)."""
        return self.spec.attributes if self.spec else {}


@dataclass
class LinkHooks:
    """What a toxic may do to the link and connection it sits on."""

    dropped: Callable[[int], None]
    reset: Callable[[], None]
    now: Callable[[], float]


async def _sleep_until(hooks: LinkHooks, moment: float) -> None:
    delay = moment - hooks.now()
    if delay > 0:
        await asyncio.sleep(delay)


async def _chunks(stage: Stage) -> AsyncIterator[Chunk]:
    """Each chunk ``stage`` takes, until the end of the stream (passed on when it comes)."""
    while True:
        item = await stage.take()
        if item is None:
            stage.emit(None)
            return
        yield item


def _emit_piece(stage: Stage, item: Chunk, data: bytes, size: int) -> bytes:
    """Emit the first ``size`` bytes of ``data`` (what is left of ``item``); hold the rest and
    return it."""
    piece, data = data[:size], data[size:]
    stage.emit(Chunk(piece, item.at))
    if data:
        stage.held = [Chunk(data, item.at)]
    return data


async def run_noop(stage: Stage) -> None:
    """Pass everything through."""
    async for item in _chunks(stage):
        stage.emit(item)


async def run_latency(stage: Stage) -> None:
    """Each chunk leaves ``latency ± jitter`` ms after it was read."""
    attrs = stage.attributes()
    async for item in _chunks(stage):
        delay = float(attrs["latency"])
        if attrs["jitter"]:
            delay += stage.rng.uniform(-attrs["jitter"], attrs["jitter"])
        await _sleep_until(stage.hooks, item.at + max(delay, 0) / 1000)
        stage.emit(item)


async def run_timeout(stage: Stage) -> None:
    """Drop everything; close after ``timeout`` ms unless it is 0."""
    timeout = stage.attributes()["timeout"]
    deadline = stage.hooks.now() + timeout / 1000 if timeout else None
    while True:
        try:
            if deadline is None:
                item = await stage.take()
            else:
                remaining = max(deadline - stage.hooks.now(), 0)
                item = await within(remaining, stage.take())
        except TimeoutError:
            stage.close()
            return
        if item is None:
            stage.close()
            return
        stage.drop(item)


async def run_reset_peer(stage: Stage) -> None:
    """On the first bytes (or the end of the stream), wait ``timeout`` ms, then reset."""
    item = await stage.take()
    if item is not None:
        stage.drop(item)
    await asyncio.sleep(stage.attributes()["timeout"] / 1000)
    stage.closed = True
    stage.hooks.reset()


async def run_bandwidth(stage: Stage) -> None:
    """At most ``rate`` KB/s, sent in pieces of at most 100 ms worth."""
    rate = stage.attributes()["rate"]
    if rate <= 0:
        await run_noop(stage)
        return
    per_second = rate * 1000
    piece_size = max(rate * 100, 1)
    free_at = stage.hooks.now()
    async for item in _chunks(stage):
        data = item.data
        while data:
            free_at = max(free_at, stage.hooks.now()) + min(piece_size, len(data)) / per_second
            await _sleep_until(stage.hooks, free_at)
            data = _emit_piece(stage, item, data, piece_size)


async def run_slow_close(stage: Stage) -> None:
    """Pass data through; hold the end of the stream for ``delay`` ms."""
    while True:
        item = await stage.take()
        if item is None:
            await asyncio.sleep(stage.attributes()["delay"] / 1000)
            stage.emit(None)
            return
        stage.emit(item)


async def run_limit_data(stage: Stage) -> None:
    """Let ``bytes`` bytes through (counted per connection), then close."""
    limit = stage.attributes()["bytes"]
    while True:
        item = await stage.take()
        if item is None:
            stage.close()
            return
        sent = stage.state.get("sent", 0)
        piece = item.data[: max(limit - sent, 0)]
        if len(piece) < len(item.data):
            stage.hooks.dropped(len(item.data) - len(piece))
        if piece:
            stage.state["sent"] = sent + len(piece)
            stage.emit(Chunk(piece, item.at))
        else:
            stage.held = []
        if stage.state.get("sent", 0) >= limit:
            stage.close()
            return


async def run_slicer(stage: Stage) -> None:
    """Slices of ``average_size ± size_variation`` bytes, ``delay`` µs apart."""
    attrs = stage.attributes()
    average, variation, delay = attrs["average_size"], attrs["size_variation"], attrs["delay"]
    async for item in _chunks(stage):
        data = item.data
        while data:
            size = average + (stage.rng.randint(-variation, variation) if variation else 0)
            data = _emit_piece(stage, item, data, size)
            if data and delay:
                await asyncio.sleep(delay / 1_000_000)


RUNNERS: dict[str, Callable[[Stage], Coroutine[Any, Any, None]]] = {
    "latency": run_latency,
    "timeout": run_timeout,
    "reset_peer": run_reset_peer,
    "bandwidth": run_bandwidth,
    "slow_close": run_slow_close,
    "limit_data": run_limit_data,
    "slicer": run_slicer,
}
#: Toxics whose removal closes the connections they acted on (their streams lost bytes).
CLOSE_ON_REMOVE = frozenset({"timeout"})
