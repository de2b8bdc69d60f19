"""Pick free TCP ports for servers started by the dev/test launchers."""

from __future__ import annotations

import socket
import threading
from collections import deque
from contextlib import ExitStack

#: Ports this process handed out lately: the OS may give a port back as soon as our probe
#: socket closes, so two servers started one after the other (a nats-server's client and
#: monitor ports, say) could otherwise be told the same port, and one fails to bind.
RECENT_LIMIT = 1024
_recent: deque[int] = deque(maxlen=RECENT_LIMIT)
_lock = threading.Lock()


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
    the same port twice within one call. Nor is a port handed out again while it is among
    the last :data:`RECENT_LIMIT` this process returned (its server may not have bound it
    yet).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with _lock, ExitStack() as stack:
        chosen: list[int] = []
        while len(chosen) < n:
            sock = stack.enter_context(_bind_ephemeral(host))  # held: never offered twice
            port = int(sock.getsockname()[1])
            if port not in _recent:
                chosen.append(port)
        _recent.extend(chosen)
        return chosen
