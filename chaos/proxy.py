"""The TCP side of the proxy: listeners, connections, and the two links of each connection.

A :class:`Proxy` listens on a loopback address and, for every client it accepts, dials
its upstream and starts a :class:`Connection`: two :class:`Link` objects, one per
direction, each a reader task → a chain of toxic stages → a writer task. When either side
closes, the writer closes the other side, so the whole connection goes down (Toxiproxy
does not half-close either).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import struct

from chaos.toxics import (
    CLOSE_ON_REMOVE,
    Chunk,
    Item,
    LinkHooks,
    Stage,
    ToxicSpec,
)
from shared.waits import within

log = logging.getLogger("chaos.proxy")

#: Bytes read at a time from a socket.
READ_SIZE = 64 * 1024
#: Bytes a link may hold (read, not yet written or dropped) before it stops reading:
#: the sender then feels TCP back-pressure, as through a real, slow network.
LINK_BUFFER = 4 * 1024 * 1024
#: Seconds allowed to dial the upstream before the client is turned away.
DIAL_TIMEOUT = 5.0


class AddressError(ValueError):
    """A listen or upstream address that cannot be used."""


def split_address(address: str, what: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) into its parts."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise AddressError(f"{what} {address!r} is not host:port")
    return host.strip("[]"), int(port_text)


def loopback_listen(address: str) -> tuple[str, int]:
    """A listen address, refused unless it is a loopback one (the suite never listens wider)."""
    host, port = split_address(address, "listen address")
    if host == "localhost":
        return "127.0.0.1", port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise AddressError(f"listen address {address!r} is not a loopback address")
    return host, port


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Link:
    """One direction of one connection: reader → stages → writer."""

    def __init__(
        self,
        connection: Connection,
        direction: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        toxics: list[ToxicSpec],
        rng: random.Random,
    ) -> None:
        self.connection, self.direction = connection, direction
        self.source, self.dest, self.rng = source, dest, rng
        self.loop = asyncio.get_running_loop()
        self.hooks = LinkHooks(dropped=self._release, reset=connection.reset, now=self.loop.time)
        self.out: asyncio.Queue[Item] = asyncio.Queue()
        self.buffered = 0
        self.room = asyncio.Event()
        self.room.set()
        self.stages = [Stage(None, self.out, self.hooks, rng)]
        for spec in toxics:
            self._append(spec)
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Run the stages, the reader and the writer."""
        for stage in self.stages:
            stage.start()
        self.tasks = [
            asyncio.create_task(self._read()),
            asyncio.create_task(self._write()),
        ]

    def _append(self, spec: ToxicSpec) -> Stage:
        stage = Stage(spec, self.out, self.hooks, self.rng)
        self.stages[-1].output = stage.input
        self.stages.append(stage)
        return stage

    def add_toxic(self, spec: ToxicSpec) -> None:
        """Splice a new toxic in at the tail of the chain (the connection is live)."""
        self._append(spec).start()

    async def remove_toxic(self, name: str) -> None:
        """Take a toxic out; what it held goes on, unless the toxic closes the stream."""
        index = self._index(name)
        if index is None:
            return
        stage, before = self.stages[index], self.stages[index - 1]
        await stage.stop()
        pending = [*stage.held, *_drain(stage.input)]
        before.output = stage.output
        del self.stages[index]
        assert stage.spec is not None
        if stage.closed:
            return
        if stage.spec.type in CLOSE_ON_REMOVE and stage.active:
            stage.output.put_nowait(None)  # the stream lost bytes: end it
            return
        for item in pending:
            stage.output.put_nowait(item)

    async def update_toxic(self, spec: ToxicSpec) -> None:
        """Restart a toxic with new attributes; it keeps its per-connection state."""
        index = self._index(spec.name)
        if index is None:
            return
        stage = self.stages[index]
        await stage.stop()
        if stage.closed:
            return
        fresh: asyncio.Queue[Item] = asyncio.Queue()
        for item in [*stage.held, *_drain(stage.input)]:
            fresh.put_nowait(item)
        stage.input, stage.held, stage.spec = fresh, [], spec
        self.stages[index - 1].output = fresh
        stage.start()

    def _index(self, name: str) -> int | None:
        for index, stage in enumerate(self.stages):
            if stage.spec is not None and stage.spec.name == name:
                return index
        return None

    def _release(self, count: int) -> None:
        self.buffered -= count
        if self.buffered < LINK_BUFFER:
            self.room.set()

    async def _read(self) -> None:
        try:
            while True:
                await self.room.wait()
                try:
                    data = await self.source.read(READ_SIZE)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    break
                self.buffered += len(data)
                if self.buffered >= LINK_BUFFER:
                    self.room.clear()
                self.stages[0].input.put_nowait(Chunk(data, self.loop.time()))
        finally:
            self.stages[0].input.put_nowait(None)

    async def _write(self) -> None:
        try:
            while True:
                item = await self.out.get()
                if item is None:
                    break
                self.dest.write(item.data)
                await self.dest.drain()
                self._release(len(item.data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.dest.close()
            self.connection.link_done()

    async def stop(self) -> None:
        """Cancel every task of the link."""
        tasks = [*self.tasks, *(s.task for s in self.stages if s.task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _drain(queue: asyncio.Queue[Item]) -> list[Item]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


class Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(
        self,
        proxy: Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.client, self.server = client, server
        self.done = asyncio.Event()
        self._open_links = 2
        rng = proxy.rng
        self.links = {
            "upstream": Link(self, "upstream", client[0], server[1], proxy.chain("upstream"), rng),
            "downstream": Link(
                self, "downstream", server[0], client[1], proxy.chain("downstream"), rng
            ),
        }

    def start(self) -> None:
        """Start both links."""
        for link in self.links.values():
            link.start()

    def link_done(self) -> None:
        """A link's writer finished (it closed its destination, which ends the other link)."""
        self._open_links -= 1
        if self._open_links <= 0:
            self.done.set()

    def close(self) -> None:
        """Close both sockets (FIN), as a disabled proxy does."""
        self.client[1].close()
        self.server[1].close()

    def reset(self) -> None:
        """Reset both sockets (TCP RST: SO_LINGER 0, then close)."""
        for writer in (self.client[1], self.server[1]):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for link in self.links.values():
            link.out.put_nowait(None)  # writers stop, whatever the stages still hold

    async def stop(self) -> None:
        """Close and wait for the links to end."""
        self.close()
        for link in self.links.values():
            await link.stop()
        self.done.set()


class Proxy:
    """One named proxy: a loopback listener, an upstream, toxics, live connections."""

    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.host, self.port = loopback_listen(listen)
        split_address(upstream, "upstream")
        self.upstream = upstream
        self.rng = rng
        self.enabled = False
        self.toxics: list[ToxicSpec] = []
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def listen(self) -> str:
        """The listen address (with the real port once bound)."""
        return _format(self.host, self.port)

    def to_json(self) -> dict[str, object]:
        """The API representation."""
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [t.to_json() for t in self.toxics],
        }

    def chain(self, direction: str) -> list[ToxicSpec]:
        """Toxics of one direction, in the order they were added."""
        return [t for t in self.toxics if t.stream == direction]

    async def enable(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        if self.enabled:
            return
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port)
        except OSError as exc:
            raise AddressError(f"cannot listen on {self.listen}: {exc.strerror}") from exc
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.enabled = True
        log.info("proxy %s listening on %s → %s", self.name, self.listen, self.upstream)

    async def disable(self) -> None:
        """Stop listening (new clients are refused) and close every connection."""
        if not self.enabled:
            return
        self.enabled = False
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        connections = list(self.connections)
        await asyncio.gather(*(c.stop() for c in connections))
        handlers = list(self._handlers)
        await asyncio.gather(*handlers, return_exceptions=True)

    async def add_toxic(self, spec: ToxicSpec) -> None:
        """Add a toxic; it applies to the live connections too."""
        self.toxics.append(spec)
        for connection in list(self.connections):
            connection.links[spec.stream].add_toxic(spec)

    async def remove_toxic(self, spec: ToxicSpec) -> None:
        """Remove a toxic from the proxy and from every live connection."""
        self.toxics.remove(spec)
        await asyncio.gather(
            *(c.links[spec.stream].remove_toxic(spec.name) for c in list(self.connections))
        )

    async def update_toxic(self, spec: ToxicSpec) -> None:
        """Apply new attributes/toxicity to the live connections."""
        await asyncio.gather(
            *(c.links[spec.stream].update_toxic(spec) for c in list(self.connections))
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)

    def _accepting(self) -> bool:
        return self.enabled

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._accepting():
            writer.close()
            return
        host, port = split_address(self.upstream, "upstream")
        try:
            server = await within(DIAL_TIMEOUT, asyncio.open_connection(host, port))
        except (OSError, TimeoutError) as exc:
            log.info("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            writer.close()
            return
        if not self._accepting():  # disabled while dialling
            server[1].close()
            writer.close()
            return
        connection = Connection(self, (reader, writer), server)
        self.connections.add(connection)
        try:
            connection.start()
            await connection.done.wait()
            await asyncio.gather(*(link.stop() for link in connection.links.values()))
        finally:
            self.connections.discard(connection)
