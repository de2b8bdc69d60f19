"""What the restore drill (:mod:`chaos.scenarios.restore.play`) is set to and works with:
the restored context and the durables it concerns, when the backup and the restore happen,
the short durable clocks, the rewind's margin; the producer it pauses during the restore,
and :class:`Drill`, the record of what the backup, the restore and the rewind did.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chaos.engine.tuning import Tuning, short_clocks
from chaos.engine.workload import Intent, Producer
from chaos.engine.world import World
from shared.contracts.lint import redelivery_horizon
from shared.contracts.topology import DurableSpec

#: The context whose database is backed up and restored.
RESTORED = "sea"
#: Fractions of the workload's duration at which the backup and the restore happen.
BACKUP_AT, RESTORE_AT = 0.45, 0.75
#: Seconds the restored context's publisher is held before the backup (unpublished rows).
PUBLISHER_HOLD = 3.0
#: Seconds of consumer lag allowed for, beyond the redelivery horizon, in the margin.
LAG_ALLOWANCE = 2.0
#: Short durable clocks: an event settles (processed or dead-lettered) within seconds, so
#: the margin (the redelivery horizon) stays short. Transient events fail 1-3 times (< 4).
CLOCKS: dict[str, Any] = short_clocks("3s", 4, ["200ms", "500ms", "1s"])
HANDLER_TIMEOUT = "2s"
#: Final inbox statuses (the event settled).
FINAL = ("processed", "failed")


class PausableProducer(Producer):
    """A producer whose transactions wait while :attr:`paused` is held (the application
    stopped for the restore); a transaction in flight finishes first."""

    def __init__(self, context: str, dsn: str, intents: list[Intent], ledger: Any) -> None:
        super().__init__(context, dsn, intents, ledger)
        self.paused = asyncio.Lock()

    async def _commit(self, conn: asyncpg.Connection, batch: list[Intent]) -> bool:
        async with self.paused:
            if conn.is_closed():  # the restore ended its session: reconnect, then commit
                return False
            return await super()._commit(conn, batch)


@dataclass
class Drill:
    """What the backup, the restore and the rewind did, and what they left."""

    backup_at: float = 0.0
    backup_seconds: float = 0.0
    backup_bytes: int = 0
    restore_at: float = 0.0
    restore_seconds: float = 0.0
    #: Producing side: ids of the restored context by where the restore left them.
    kept: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)
    forgotten_published: set[str] = field(default_factory=set)
    republished: set[str] = field(default_factory=set)
    unpublished_kept: set[str] = field(default_factory=set)
    #: Committed before the backup began, absent from the restored database (must be none).
    missing: list[str] = field(default_factory=list)
    #: Consuming side, per durable targeting the restored context.
    settled_kept: dict[str, set[str]] = field(default_factory=dict)
    settled_forgotten: dict[str, set[str]] = field(default_factory=dict)
    effects_forgotten: dict[str, int] = field(default_factory=dict)
    inbox_duplicates_before: dict[str, int] = field(default_factory=dict)
    #: Per durable: duplicates counted on each processed id of the restored inbox, then.
    processed_duplicates_before: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Downstream durables (reading the restored context's stream): duplicates per id of
    #: the re-published rows, before the restore.
    downstream_duplicates_before: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per rewound durable: since (ISO), margin, and the command's JSON (or its error).
    rewinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    rewind_errors: list[str] = field(default_factory=list)


def restore_tuning() -> Tuning:
    """The sea-vibespro world with short durable clocks (see :data:`CLOCKS`)."""
    return Tuning(clocks=dict(CLOCKS), handler_timeout=HANDLER_TIMEOUT)


def margin_of(durable: DurableSpec) -> float:
    """Seconds before the backup a rewind of ``durable`` starts: an event published that
    long before it may have settled after it (its redelivery horizon, plus lag)."""
    return float(math.ceil(redelivery_horizon(durable) + LAG_ALLOWANCE))


def consuming(world: World) -> list[str]:
    """Durables targeting the restored context (rewound after the restore)."""
    return sorted(n for n, d in world.topo.durables.items() if d.target == RESTORED)


def downstream(world: World) -> list[str]:
    """Durables reading the restored context's stream."""
    stream = world.topo.contexts[RESTORED].stream
    assert stream is not None
    return sorted(n for n, d in world.topo.durables.items() if d.stream == stream.name)
