"""Start a Toxiproxy: the real ``toxiproxy-server`` when one is on PATH, else ours.

``FERRY_TOXIPROXY`` chooses: ``auto`` (default: the binary on PATH if any, else
:mod:`chaos.toxiproxy_server`), ``builtin`` (always ours), or a path to a
``toxiproxy-server`` binary. Either way the server listens on loopback only and is
driven through the same HTTP API (with ``toxiproxy-python``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.ports import free_port

#: Environment variable that picks the implementation (see the module docstring).
CHOICE_ENV = "FERRY_TOXIPROXY"
ROOT = Path(__file__).resolve().parents[1]
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ToxiproxyError(RuntimeError):
    """The proxy server could not be started or answered unexpectedly."""


def server_argv(port: int, seed: int | None = None) -> tuple[str, list[str]]:
    """(kind, command line) of the Toxiproxy to run on ``port``."""
    choice = os.environ.get(CHOICE_ENV, "auto")
    if choice == "builtin":
        binary = None
    elif choice == "auto":
        binary = shutil.which("toxiproxy-server")
    else:
        if not (Path(choice).is_file() and os.access(choice, os.X_OK)):
            raise ToxiproxyError(f"{CHOICE_ENV}={choice!r} is not an executable file")
        binary = choice
    seed_args = [] if seed is None else [str(seed)]
    if binary is not None:
        argv = [binary, "-host", "127.0.0.1", "-port", str(port)]
        return "toxiproxy-server", argv + (["-seed", *seed_args] if seed_args else [])
    argv = [sys.executable, "-m", "chaos.toxiproxy_server", "--port", str(port)]
    return "chaos.toxiproxy_server", argv + (["--seed", *seed_args] if seed_args else [])


@dataclass
class ToxiproxyProcess:
    """A running Toxiproxy server process and how to reach its API."""

    kind: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    host: str = "127.0.0.1"
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://{self.host}:{self.port}"

    def version(self) -> str:
        """What ``GET /version`` says (raises if the server does not answer)."""
        with _HTTP.open(self.url + "/version", timeout=2) as response:
            body: Any = json.loads(response.read() or b"{}")
        return str(body.get("version", "?")) if isinstance(body, dict) else str(body)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Poll ``/version`` until it answers; fail with the log if the process died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ToxiproxyError(
                    f"{self.kind} exited with {self.proc.returncode}: {self._log_tail()}"
                )
            try:
                self.version()
                return
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.05)
        raise ToxiproxyError(f"{self.kind} did not answer within {timeout}s: {self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return "(no log)"


def start_toxiproxy(log_path: Path, *, seed: int | None = None) -> ToxiproxyProcess:
    """Start the chosen Toxiproxy on a free loopback port and wait until its API answers."""
    port = free_port()
    kind, argv = server_argv(port, seed)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    server = ToxiproxyProcess(kind, port, proc, log_path)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def running_toxiproxy(log_path: Path, *, seed: int | None = None) -> Iterator[ToxiproxyProcess]:
    """:func:`start_toxiproxy` as a context manager."""
    server = start_toxiproxy(log_path, seed=seed)
    try:
        yield server
    finally:
        server.stop()
