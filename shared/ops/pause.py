"""Pausing and resuming a durable (``ferry durable pause|resume``, the console; issue 45).

A pause is JetStream's consumer pause, set on every consumer of the durable (each
partition's, for an ordered durable, with one ``pause_until``, so its partitions pause and
resume together). While it lasts the server delivers nothing to the durable's consumers and
redelivers nothing: no delivery is spent, the messages wait in the stream, and what a
consumer already holds is finished and acknowledged as usual (acks are accepted while
paused). At ``until`` the server resumes by itself; ``resume`` ends the pause at once.
A running consumer needs no signal: its pull requests are simply not served, and it
exports the pause (``ferry_consumer_paused``) for the overview, alerts and KEDA, which
holds a paused lane at its replica count (k8s/roles.py).

Every pause and resume is recorded in ``pause_actions`` (migration 0018) in the durable's
target database: who, when, until when, why. The database is reached before JetStream is
touched, so an unreachable database refuses the change instead of leaving it unaudited.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.adapters import pauses
from shared.adapters.jetstream import NATS_FAILURES
from shared.adapters.postgres import connect
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError
from shared.domain.pause import INDEFINITE, parse_server_time, rfc3339
from shared.runtime.settings import CommonSettings

#: Attempts per consumer before a pause or resume is reported incomplete.
ATTEMPTS = 3


class PauseIncomplete(ConfigurationError):
    """Some of the durable's consumers did not take the change (the message names them);
    the change is recorded, and running the command again finishes it."""


@dataclass(frozen=True)
class ConsumerPause:
    """One JetStream consumer of the durable, as the server reports it."""

    name: str
    paused: bool
    #: When the server resumes it by itself (None: not paused).
    until: datetime | None
    #: Why it could not be read (the rest is then unknown).
    error: str | None = None


@dataclass(frozen=True)
class PauseState:
    """A durable's pause: each consumer's, and the latest recorded changes."""

    durable: str
    consumers: list[ConsumerPause]
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        """Every consumer of the durable is paused (as far as they could be read)."""
        readable = [c for c in self.consumers if c.error is None]
        return bool(readable) and all(c.paused for c in readable)

    @property
    def unknown(self) -> list[str]:
        """The consumers whose state could not be read (then paused or not is unknown)."""
        return [c.name for c in self.consumers if c.error is not None]

    @property
    def partly(self) -> bool:
        """Some consumers paused and some not (a change that did not finish)."""
        flags = {c.paused for c in self.consumers if c.error is None}
        return len(flags) > 1

    @property
    def until(self) -> datetime | None:
        """The earliest end among the paused consumers."""
        ends = [c.until for c in self.consumers if c.paused and c.until is not None]
        return min(ends) if ends else None

    @property
    def set_by(self) -> dict[str, Any] | None:
        """The newest recorded pause while paused: who paused it and why."""
        if not self.paused:
            return None
        return next((a for a in self.history if a["action"] == "pause"), None)


async def read_pause(js: Any, stream: str, name: str) -> ConsumerPause:
    """One consumer's pause as the server reports it."""
    try:
        info = await js.consumer_info(stream, name, timeout=5)
    except NATS_FAILURES as exc:
        return ConsumerPause(name, False, None, error=f"{type(exc).__name__}: {exc}"[:200])
    paused = bool(info.paused)
    until = parse_server_time(info.config.pause_until) if paused else None
    return ConsumerPause(name, paused, until)


async def _each(js: Any, stream: str, names: list[str], until: datetime) -> dict[str, str]:
    """Pause (or, with a past ``until``, resume) every consumer in ``names`` at once, each
    retried up to :data:`ATTEMPTS` times; the names that failed, with why."""
    stamp = rfc3339(until)

    async def one(name: str) -> str | None:
        error = "not tried"
        for attempt in range(ATTEMPTS):
            try:
                await js.pause_consumer(stream, name, stamp, timeout=5)
                return None
            except NATS_FAILURES as exc:
                error = f"{type(exc).__name__}: {exc}"[:200]
                await asyncio.sleep(0.5 * (attempt + 1))
        return error

    results = await asyncio.gather(*(one(n) for n in names))
    return {n: e for n, e in zip(names, results, strict=True) if e is not None}


async def _change(
    settings: CommonSettings,
    topology: Topology,
    nc: Any,
    durable: str,
    until: datetime | None,
    *,
    actor: str,
    reason: str,
) -> PauseState:
    spec = topology.durable(durable)
    names = [plan.name for plan in topology.consumers(durable)]
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        js = nc.jetstream()
        resume = until is None
        target = datetime(1970, 1, 1, tzinfo=UTC) if resume else until
        assert target is not None
        action = "resume" if resume else "pause"
        # The audit row is written first and committed once a consumer took the change: a
        # change never stands unrecorded, and one no consumer took leaves no record.
        transaction = conn.transaction()
        await transaction.start()
        try:
            await pauses.record(conn, durable, action, until, actor=actor, reason=reason)
            failed = await _each(js, spec.stream, names, target)
        except BaseException:
            await transaction.rollback()
            raise
        if len(failed) < len(names):
            await transaction.commit()
        else:
            await transaction.rollback()
        state = await _state(conn, js, spec.stream, durable, names, 10)
    finally:
        await conn.close()
    if failed:
        listed = "; ".join(f"{n}: {e}" for n, e in sorted(failed.items()))
        verb = "resume" if until is None else "pause"
        raise PauseIncomplete(
            f"{durable}: {len(failed)} of {len(names)} consumer(s) did not {verb} ({listed}); "
            "run the command again to finish"
        )
    return state


async def pause_durable(
    settings: CommonSettings,
    topology: Topology,
    nc: Any,
    durable: str,
    until: datetime | None = None,
    *,
    actor: str,
    reason: str,
) -> PauseState:
    """Pause every consumer of ``durable`` until ``until`` (None: until resumed), audited;
    its state after. :class:`PauseIncomplete` when some consumer did not take it."""
    return await _change(
        settings, topology, nc, durable, until or INDEFINITE, actor=actor, reason=reason
    )


async def resume_durable(
    settings: CommonSettings, topology: Topology, nc: Any, durable: str, *, actor: str, reason: str
) -> PauseState:
    """End ``durable``'s pause on every consumer at once, audited; its state after."""
    return await _change(settings, topology, nc, durable, None, actor=actor, reason=reason)


async def _state(
    conn: Any, js: Any, stream: str, durable: str, names: list[str], history: int
) -> PauseState:
    consumers = await asyncio.gather(*(read_pause(js, stream, n) for n in names))
    return PauseState(durable, list(consumers), await pauses.actions(conn, durable, history))


async def pause_state(
    settings: CommonSettings, topology: Topology, nc: Any, durable: str, history: int = 10
) -> PauseState:
    """``durable``'s pause now, per consumer, with its ``history`` latest changes."""
    spec = topology.durable(durable)
    names = [plan.name for plan in topology.consumers(durable)]
    conn = await connect(settings.dsn(topology.context(spec.target).database))
    try:
        return await _state(conn, nc.jetstream(), spec.stream, durable, names, history)
    finally:
        await conn.close()
