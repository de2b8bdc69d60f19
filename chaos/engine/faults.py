"""Carrying out faults on a :class:`~chaos.engine.world.World`, and the timeline of what happened.

Process faults SIGKILL real processes. The two *crash-window* kills use the stall-trigger
technique of the integration tests: a trigger makes the role's own UPDATE sleep inside
PostgreSQL, so the process is provably inside its window when the SIGKILL lands —

* ``kill_publisher_in_window``: a BEFORE UPDATE trigger on ``outbox_events`` stalls the
  publisher's mark-published, which runs only after every PubAck of the batch arrived;
* ``kill_consumer_in_window``: a BEFORE UPDATE trigger on ``inbox_messages`` stalls the
  update to ``processed``, which runs only after the handler answered 200.

The stalled backend is then terminated (its transaction rolls back, as the dead
process's would) and the trigger dropped. Network faults are Toxiproxy toxics on the
role's proxied links, added and removed through ``toxiproxy-python``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chaos.engine.roles import Role
from chaos.engine.schedule import PlannedFault
from chaos.engine.stall import WINDOWS, arm_and_wait, disarm_fully, terminate_stalled
from chaos.engine.world import World

log = logging.getLogger("chaos.engine.faults")

#: Seconds a killed role stays down before it is restarted (as a supervisor would).
RESTART_DELAY = (0.3, 2.0)
#: Seconds a killed server stays down.
SERVER_DOWN = (1.0, 3.0)
#: Seconds to wait for a role to enter its crash window before killing it anyway.
WINDOW_WAIT = 25.0


@dataclass
class FaultRecord:
    """One fault as it really happened."""

    kind: str
    target: str
    planned_at: float
    started: float
    ended: float = 0.0
    ok: bool = True
    detail: str = ""
    #: Durables whose handler calls this fault could make redundant ("*": all).
    affects: frozenset[str] = frozenset()
    #: When the run took the fault's cause away (the network back, the server started
    #: again); 0 when the platform must recover by itself (a kill). Recovery counts from it
    #: (:mod:`chaos.engine.recovery`).
    restored: float = 0.0
    #: Seconds the pipeline took to get over it, once the run measured it (None: not
    #: measured, or no affected event came through; :mod:`chaos.engine.recovery`).
    recovery: float | None = None

    def line(self, origin: float) -> str:
        """A timeline line, times relative to ``origin``."""
        span = self.ended - self.started
        status = "" if self.ok else "  [FAILED]"
        target = f" {self.target}" if self.target else ""
        recovered = "" if self.recovery is None else f"  [recovery {self.recovery:.1f}s]"
        return (
            f"t+{self.started - origin:7.2f}s  {span:5.1f}s  {self.kind}{target}"
            f"{': ' + self.detail if self.detail else ''}{status}{recovered}"
        )


@dataclass
class Timeline:
    """Every fault injected, and every role exit nobody asked for."""

    origin: float
    records: list[FaultRecord] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)

    def note(self, text: str) -> None:
        """Record a notable event that is not a fault (an unexpected exit, a restart)."""
        self.events.append((time.time(), text))
        log.warning("%s", text)

    def by_kind(self) -> Counter[str]:
        """Faults injected, by kind."""
        return Counter(r.kind for r in self.records if r.ok)


class FaultInjector:
    """Runs planned faults against a world, one task each, serialised where they collide."""

    def __init__(self, world: World, timeline: Timeline, rng_seed: int) -> None:
        self.world, self.timeline = world, timeline
        self.rng = random.Random(f"faults-{rng_seed}")
        self.locks: dict[str, asyncio.Lock] = {}
        self.counter = 0
        self.actions: dict[str, Callable[[FaultRecord, PlannedFault], Awaitable[None]]] = {
            "kill_publisher": self._kill_role,
            "kill_consumer": self._kill_role,
            "kill_router": self._kill_role,
            "kill_publisher_in_window": self._kill_in_window,
            "kill_consumer_in_window": self._kill_in_window,
            "kill_nats": self._kill_nats,
            "crash_postgres": self._crash_postgres,
            "nats_reset_peer": self._nats_reset_peer,
            "handler_latency": self._toxic_fault,
            "handler_blackhole": self._toxic_fault,
            "handler_limit_data": self._toxic_fault,
            "pg_latency": self._toxic_fault,
            "pg_reset_peer": self._toxic_fault,
            "nats_slicer": self._toxic_fault,
            "nats_bandwidth": self._toxic_fault,
            "nats_blackhole": self._toxic_fault,
            "link_down": self._link_down,
        }

    def lock(self, name: str) -> asyncio.Lock:
        """The lock serialising faults on ``name`` (a role, ``pg`` or ``nats``)."""
        return self.locks.setdefault(name, asyncio.Lock())

    async def inject(self, planned: PlannedFault) -> FaultRecord:
        """Carry out one planned fault and record it."""
        record = FaultRecord(planned.kind, planned.target, planned.at, time.time())
        try:
            await self.actions[planned.kind](record, planned)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            record.ok = False
            record.detail = f"{record.detail} {type(exc).__name__}: {exc}".strip()
            log.exception("fault %s failed", planned.kind)
        record.ended = max(record.ended, time.time())
        self.timeline.records.append(record)
        log.info("%s", record.line(self.timeline.origin))
        return record

    # -- processes ---------------------------------------------------------------------

    def _role(self, planned: PlannedFault) -> Role:
        if planned.kind.startswith("kill_publisher"):
            return self.world.roles[f"publisher-{planned.target}"]
        if planned.kind.startswith("kill_consumer"):
            return self.world.roles[f"consumer-{planned.target}"]
        return self.world.roles["dlq-router"]

    async def _kill_role(self, record: FaultRecord, planned: PlannedFault) -> None:
        role = self._role(planned)
        record.target, record.affects = role.name, role.durables
        async with self.lock(role.name):
            await self._kill_and_restart(record, role)

    async def _kill_and_restart(self, record: FaultRecord, role: Role) -> None:
        pid = role.pid
        await asyncio.to_thread(role.kill)
        record.started = time.time()
        down = self.rng.uniform(*RESTART_DELAY)
        await asyncio.sleep(down)
        role.start()
        record.detail = (record.detail + f" pid {pid} killed, restarted after {down:.1f}s").strip()

    async def _kill_in_window(self, record: FaultRecord, planned: PlannedFault) -> None:
        role = self._role(planned)
        record.target, record.affects = role.name, role.durables
        if planned.kind == "kill_publisher_in_window":
            dsn = self.world.direct_dsn(planned.target)
        else:
            dsn = self.world.direct_dsn(self.world.topo.durables[planned.target].target)
        table, where = WINDOWS[planned.kind]
        async with self.lock("pg"), self.lock(role.name):
            conn = await asyncpg.connect(dsn, timeout=10)
            try:
                stalled = await arm_and_wait(conn, table, where, WINDOW_WAIT)
                record.detail = (
                    "in window" if stalled else f"window not reached in {WINDOW_WAIT:.0f}s"
                )
                pid = role.pid
                await asyncio.to_thread(role.kill)
                record.started = time.time()
                # The dead client's backend sleeps on in the trigger, holding its locks:
                # end it, which rolls its transaction back exactly as the crash would have.
                await terminate_stalled(conn, where)
            finally:
                await disarm_fully(conn, table, where)
                await conn.close()
            down = self.rng.uniform(*RESTART_DELAY)
            await asyncio.sleep(down)
            role.start()
            record.detail += f"; pid {pid} killed, restarted after {down:.1f}s"

    async def _kill_nats(self, record: FaultRecord, planned: PlannedFault) -> None:
        record.affects = frozenset()
        server = self.world.nats_server()
        await self._kill_server(record, "nats", server.kill, server.start, "restarted on its store")

    async def _crash_postgres(self, record: FaultRecord, planned: PlannedFault) -> None:
        record.affects = frozenset({"*"})
        server = self.world.postgres()
        await self._kill_server(
            record, "pg", server.kill, server.start, "crash recovery on restart"
        )

    async def _kill_server(
        self,
        record: FaultRecord,
        lock: str,
        kill: Callable[[], None],
        start: Callable[[], None],
        after: str,
    ) -> None:
        """SIGKILL a server, and start it again after a while."""
        async with self.lock(lock):
            await asyncio.to_thread(kill)
            record.started = time.time()
            down = self.rng.uniform(*SERVER_DOWN)
            await asyncio.sleep(down)
            await asyncio.to_thread(start)
            record.restored = time.time()
            record.detail = f"down {down:.1f}s, {after}"

    # -- network -----------------------------------------------------------------------

    def _toxic_name(self, kind: str) -> str:
        self.counter += 1
        return f"chaos_{kind}_{self.counter}"

    async def _with_toxic(
        self, record: FaultRecord, links: list[str], spec: dict[str, Any], seconds: float
    ) -> None:
        """Add one toxic to each link, keep it ``seconds``, remove it again."""
        name = self._toxic_name(record.kind)
        proxies = await asyncio.to_thread(lambda: [self.world.client.get_proxy(n) for n in links])
        added = []
        try:
            for link, proxy in zip(links, proxies, strict=True):
                if proxy is None:
                    raise RuntimeError(f"no proxy {link!r}")
                await asyncio.to_thread(proxy.add_toxic, name=name, **spec)
                added.append(proxy)
            record.started = time.time()
            await asyncio.sleep(seconds)
        finally:
            for proxy in added:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(proxy.destroy_toxic, name)
            record.restored = time.time()

    async def _nats_reset_peer(self, record: FaultRecord, planned: PlannedFault) -> None:
        links = [link.name for link in self.world.links_of("nats")]
        record.target = "every NATS link"
        spec = {"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 0}}
        await self._with_toxic(record, links, spec, planned.duration)

    async def _toxic_fault(self, record: FaultRecord, planned: PlannedFault) -> None:
        link, spec, affects = self._toxic_target(planned)
        record.target, record.affects = link, affects
        record.detail = f"{spec['type']} {spec.get('attributes', {})}"
        await self._with_toxic(record, [link], spec, planned.duration)

    def _toxic_target(self, planned: PlannedFault) -> tuple[str, dict[str, Any], frozenset[str]]:
        kind, target = planned.kind, planned.target
        if kind.startswith("handler_"):
            link = f"consumer-{target}_handler"
            specs = {
                "handler_latency": {"type": "latency", "attributes": {"latency": 5000}},
                "handler_blackhole": {
                    "type": "timeout",
                    "stream": "upstream",
                    "attributes": {"timeout": 0},
                },
                "handler_limit_data": {"type": "limit_data", "attributes": {"bytes": 40}},
            }
            return link, specs[kind], frozenset({target})
        role = self.world.roles[target]
        if kind.startswith("pg_"):
            specs = {
                "pg_latency": {"type": "latency", "attributes": {"latency": 300, "jitter": 200}},
                "pg_reset_peer": {
                    "type": "reset_peer",
                    "stream": "upstream",
                    "attributes": {"timeout": 0},
                },
            }
            return f"{target}_pg", specs[kind], role.durables
        specs = {
            "nats_slicer": {
                "type": "slicer",
                "attributes": {"average_size": 32, "size_variation": 31, "delay": 200},
            },
            "nats_bandwidth": {"type": "bandwidth", "attributes": {"rate": 20}},
            # The server's writes succeed and go nowhere: what it delivers meanwhile is
            # pending on it, never seen by the role, until its ack_wait runs out.
            "nats_blackhole": {
                "type": "timeout",
                "stream": "downstream",
                "attributes": {"timeout": 1000},
            },
        }
        return f"{target}_nats", specs[kind], frozenset()

    async def _link_down(self, record: FaultRecord, planned: PlannedFault) -> None:
        link = self.world.links[planned.target]
        role = self.world.roles[link.role]
        record.affects = role.durables if link.kind != "nats" else frozenset()
        proxy = await asyncio.to_thread(self.world.client.get_proxy, link.name)
        if proxy is None:
            raise RuntimeError(f"no proxy {link.name!r}")
        await asyncio.to_thread(proxy.disable)
        record.started = time.time()
        try:
            await asyncio.sleep(planned.duration)
        finally:
            await asyncio.to_thread(proxy.enable)
            record.restored = time.time()
