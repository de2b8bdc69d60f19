"""A durable's throttle: its processing rate limit, changed while it runs (``ferry durable
throttle``, shared/cli/throttle.py).

The override is a row of ``throttle_overrides`` (migration 0012) in the database of the
durable's target context; the durable's running consumers read it every
``FERRY_THROTTLE_POLL_INTERVAL`` seconds (2 s by default) and change their token bucket
in place: no restart, no message lost or redelivered (INFRA-005 §7.3). Every set and
clear is recorded in ``throttle_actions`` with who, when and why. A ``criticality:
high`` durable is never throttled: :class:`ThrottleRefused`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from shared.adapters import throttles
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError
from shared.domain.throttle import Limit
from shared.runtime.settings import CommonSettings


class ThrottleRefused(ConfigurationError):
    """A throttle the durable may not have (a ``criticality: high`` durable)."""


@dataclass(frozen=True)
class ThrottleState:
    """What limits a durable: the topology's, the override in force, the latest changes."""

    durable: str
    criticality: str
    #: The topology's limit (None: no limit).
    default: Limit | None
    override: throttles.Override | None
    history: list[dict[str, Any]]

    @property
    def in_force(self) -> Limit | None:
        """The override's limit when there is one, else the topology's."""
        return self.override.limit() if self.override is not None else self.default


def topology_limit(topology: Topology, durable: str) -> Limit | None:
    """The limit the topology declares for ``durable`` (None: no limit)."""
    spec = topology.durable(durable)
    return spec.throttle.limit() if spec.throttle else None


def check_throttleable(topology: Topology, durable: str, rate: float | None) -> None:
    """:class:`ThrottleRefused` when ``rate`` (None: no limit) may not be set on ``durable``."""
    if rate is not None and topology.durable(durable).criticality == "high":
        raise ThrottleRefused(
            f"{durable} is declared criticality: high and is never throttled "
            "(INFRA-005 §7: a critical lane's messages must not wait)"
        )


@asynccontextmanager
async def _connect(
    settings: CommonSettings, topology: Topology, durable: str
) -> AsyncIterator[Any]:
    spec = topology.durable(durable)
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        yield conn
    finally:
        await conn.close()


async def set_throttle(
    settings: CommonSettings,
    topology: Topology,
    durable: str,
    rate: float | None,
    burst: int | None,
    *,
    actor: str,
    reason: str,
) -> Limit | None:
    """Override ``durable``'s limit with ``rate`` per second (None: no limit) and ``burst``,
    audited; the limit set."""
    check_throttleable(topology, durable, rate)
    limit = None if rate is None else Limit.of(rate, burst)
    async with _connect(settings, topology, durable) as conn:
        await throttles.set_override(conn, durable, rate, burst, actor=actor, reason=reason)
    return limit


async def clear_throttle(
    settings: CommonSettings, topology: Topology, durable: str, *, actor: str, reason: str
) -> bool:
    """Remove ``durable``'s override (audited): the topology's limit again; False when
    there was none."""
    async with _connect(settings, topology, durable) as conn:
        return await throttles.clear_override(conn, durable, actor=actor, reason=reason)


async def throttle_state(
    settings: CommonSettings, topology: Topology, durable: str, history: int = 10
) -> ThrottleState:
    """``durable``'s limits now, with its ``history`` latest changes."""
    spec = topology.durable(durable)
    async with _connect(settings, topology, durable) as conn:
        found = await throttles.current(conn, durable)
        actions = await throttles.actions(conn, durable, limit=history)
    return ThrottleState(
        durable, spec.criticality, topology_limit(topology, durable), found, actions
    )
