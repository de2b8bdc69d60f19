"""Pick free TCP ports for servers started by the dev/test launchers."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def _bind_ephemeral(host: str) -> socket.socket:
    """Bind a TCP socket to an OS-chosen port on ``host`` and return it (still open)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free at the time of the call."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``n`` distinct TCP ports on ``host`` that were free at the time of the call.

    All sockets are held open until every port is chosen, so the OS cannot hand out
    the same port twice within one call.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with ExitStack() as stack:
        sockets = [stack.enter_context(_bind_ephemeral(host)) for _ in range(n)]
        return [int(sock.getsockname()[1]) for sock in sockets]
