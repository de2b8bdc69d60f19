"""NATS connection with the settings a long-running role needs.

nats-py's defaults are wrong for a role that must never silently stop (DESIGN §6a):
it gives up reconnecting after about two minutes, and with a two-minute ping interval a
black-holed link goes unnoticed for minutes. Every role connects through here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats
from nats.aio.client import Client as NATS
from nats.errors import NoServersError

from shared.domain.errors import ConfigurationError

log = logging.getLogger("ferry.nats")

#: Pings missed before the client declares the link dead (interval x this = detection).
MAX_OUTSTANDING_PINGS = 3
#: Pause between reconnect attempts; reconnects never stop (-1).
RECONNECT_WAIT_SECONDS = 0.5
#: Upper bound of the wait between initial connection attempts.
INITIAL_CONNECT_MAX_WAIT = 5.0


async def connect_nats(
    servers: list[str],
    *,
    name: str,
    ping_interval: float = 2.0,
    user: str | None = None,
    password: str | None = None,
    on_state: Callable[[bool], None] | None = None,
    give_up_after: float | None = None,
) -> NATS:
    """Connect, retrying the first connection with back-off; reconnect forever afterwards.

    ``on_state(connected)`` is called on every disconnect and reconnect (for /readyz).
    ``give_up_after`` bounds the initial attempts (seconds); None retries forever.
    """

    async def disconnected() -> None:
        log.warning("nats disconnected", extra={"role_event": "nats_disconnected"})
        if on_state:
            on_state(False)

    async def reconnected() -> None:
        log.info("nats reconnected")
        if on_state:
            on_state(True)

    async def error(exc: Exception) -> None:
        log.warning("nats error: %s", exc)

    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    wait = 0.2
    while True:
        try:
            nc = await nats.connect(
                servers=servers,
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=RECONNECT_WAIT_SECONDS,
                ping_interval=ping_interval,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                connect_timeout=2,
                user=user,
                password=password,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
            )
        except (NoServersError, OSError, TimeoutError) as exc:
            if deadline is not None and loop.time() + wait > deadline:
                raise ConfigurationError(
                    f"cannot reach NATS at {', '.join(servers)}: {exc}"
                ) from exc
            log.warning("nats not reachable at %s (%s); retrying in %.1fs", servers, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, INITIAL_CONNECT_MAX_WAIT)
            continue
        if on_state:
            on_state(True)
        return nc
