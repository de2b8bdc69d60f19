"""Fixtures for the proxy tests: a Toxiproxy (real binary if on PATH, else ours) and real sockets.

The proxy tests are synchronous: ``toxiproxy-python`` is a blocking client, and plain
sockets with timeouts make every wait bounded. Our server then runs on its own event loop
in a thread (:func:`chaos.toxiproxy_server.serve_in_thread`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

from chaos.engine.config import RunConfig
from chaos.engine.recovery_table import KindRecovery, recovery_doc
from chaos.engine.scenario_result import ScenarioResult
from chaos.launcher import CHOICE_ENV, running_toxiproxy
from chaos.registry import run_scenario
from chaos.toxiproxy_server import serve_in_thread

#: Every socket operation in these tests gives up after this many seconds.
IO_TIMEOUT = 10.0
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Api:
    """A Toxiproxy API endpoint, with the Python client pointed at it."""

    host: str
    port: int
    kind: str
    client: Toxiproxy = field(default_factory=Toxiproxy)

    def __post_init__(self) -> None:
        self.client.update_api_consumer(self.host, self.port)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A raw API call: (status, decoded JSON body or None)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}{path}",
            data=data.encode() if isinstance(data, str) else data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with _HTTP.open(request, timeout=IO_TIMEOUT) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
            exc.close()
        return status, json.loads(raw) if raw.strip() else None

    def proxy(self, name: str, upstream: str) -> Proxy:
        """Create a proxy on a free loopback port."""
        return self.client.create(upstream=upstream, name=name, listen="127.0.0.1:0")


@pytest.fixture
def toxiproxy(tmp_path: Path) -> Iterator[Api]:
    """A Toxiproxy API with no proxies; everything created is destroyed afterwards."""
    real = os.environ.get(CHOICE_ENV, "auto") != "builtin" and shutil.which("toxiproxy-server")
    if real:
        with running_toxiproxy(tmp_path / "toxiproxy.log", seed=7) as server:
            api = Api(server.host, server.port, server.kind)
            yield api
            api.client.destroy_all()
    else:
        with serve_in_thread(seed=7) as endpoint:
            api = Api(endpoint.host, endpoint.port, "chaos.toxiproxy_server (in-process)")
            yield api
            api.client.destroy_all()


class EchoServer:
    """A threaded TCP server on loopback that echoes, counting the bytes it received.

    With ``greeting`` it sends that first; with ``close_after_greeting`` it then closes.
    """

    def __init__(self, *, greeting: bytes = b"", close_after_greeting: bool = False) -> None:
        self.greeting, self.close_after_greeting = greeting, close_after_greeting
        self.received = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    @property
    def address(self) -> str:
        """host:port of the server."""
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._sockets.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.greeting:
                conn.sendall(self.greeting)
                if self.close_after_greeting:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                with self._lock:
                    self.received += len(data)
                conn.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        """Stop accepting, close every connection, join the threads."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._listener.close()
        with self._lock:
            for conn in self._sockets:
                conn.close()
        for thread in self._threads:
            thread.join(timeout=IO_TIMEOUT)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    """An echo server."""
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


def connect(proxy: Proxy, timeout: float = IO_TIMEOUT) -> socket.socket:
    """A client socket to ``proxy``'s listen address."""
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    """Exactly ``count`` bytes (fails on EOF first)."""
    parts, got = [], 0
    while got < count:
        data = sock.recv(min(65536, count - got))
        if not data:
            raise AssertionError(f"connection closed after {got} of {count} bytes")
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def recv_until_closed(sock: socket.socket) -> tuple[bytes, int]:
    """(everything until EOF, number of recv calls that returned data)."""
    parts = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(parts), len(parts)
        parts.append(data)


ResultT = TypeVar("ResultT")


async def run_as(config: RunConfig, name: str | None, kind: type[ResultT]) -> ResultT:
    """Run scenario ``name`` (None: the ordinary run) at CI size through the registry, as the
    command does (its files written); its result, of the type ``kind`` it must be."""
    result = await run_scenario(config, name, "ci")
    assert isinstance(result, kind), result
    return result


async def told_scenario(run_dir: Path, name: str, seed: int) -> tuple[Any, dict[str, Any], str]:
    """Run chaos scenario ``name`` at CI size in ``run_dir``: (its ScenarioResult, its table
    as written to ``scenario.json``, the story a failed assertion prints: the seed and how
    to run it again, the table, the progress lines)."""
    progress: list[str] = []
    config = RunConfig(seed=seed, run_dir=run_dir, echo=progress.append)
    result = await run_as(config, name, ScenarioResult)
    story = (
        f"\nseed {seed} (re-run: python -m chaos.run --scenario {name} --seed {seed})\n\n"
        + result.render()
        + "\n\nProgress\n"
        + "\n".join(progress)
    )
    return result, json.loads((run_dir / "scenario.json").read_text()), story


def recovery_gaps(
    recovery: Mapping[str, KindRecovery], written: Mapping[str, Any], injected: Iterable[str]
) -> list[str]:
    """What the recovery table of a run lacks: a kind ``injected`` without a line, a line
    without a figure (no affected event came through after any fault of the kind), or a
    report (``written``: its ``recovery`` entry) that says otherwise than the result."""
    gaps = [f"{kind}: no line" for kind in sorted(set(injected) - set(recovery))]
    gaps += [f"{kind}: no figure" for kind, line in recovery.items() if line.max is None]
    if dict(written) != recovery_doc(recovery):
        gaps.append(f"the report's recovery differs: {dict(written)}")
    return gaps
