"""The dlq-replayer's behaviour (REQ-059; INFRA-005 §4.3 for operator-only durables).

Every ``interval`` it scans, per durable:

* replays that the consumer has since processed become ``replayed`` (all durables);
* under the **automatic** policy, dead letters whose ``next_replay_at`` has passed are
  replayed, oldest first, no faster than the durable's ``replay_limits.rate`` (a token
  bucket, so a storm of due entries cannot swamp a handler that is just recovering).
  Each replay's outcome decides what comes next: processed → ``replayed``; dead-lettered
  again → ``dead`` with a longer full-jitter delay, or ``parked`` once ``max_attempts``
  replays have failed (that transition happens where the failure is recorded);
* under the **operator** policy it never replays anything by itself;
* the failure groups' pending count changes are folded (:mod:`shared.adapters.dead_letters.groups`).

Replays go through :func:`shared.adapters.dead_letters.replay`: a fresh Nats-Msg-Id, the
same message_id, and a subject only the failed durable receives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from uuid import UUID

from services.dlq_replayer.metrics import ReplayerMetrics
from shared.adapters import dead_letters
from shared.adapters.jetstream import JetStream
from shared.adapters.postgres import Conn, Pool
from shared.adapters.transient import TRANSIENT_ERRORS
from shared.contracts.topology import Topology
from shared.domain.throttle import Limit, TokenBucket, default_burst
from shared.runtime.metrics import RoleMetrics
from shared.waits import sleep_unless

log = logging.getLogger("ferry.dlq_replayer")

ACTOR = "dlq-replayer"
#: Seconds after which a replay whose publish was never confirmed is published again.
UNCONFIRMED_AFTER = 30.0
#: Transient (:data:`shared.adapters.transient.TRANSIENT_ERRORS`). A replay whose
#: publish fails stays 'replaying' and unconfirmed, its attempt counted once: the next
#: scans publish it again under the same Nats-Msg-Id (republish_unconfirmed).
ERRORS = TRANSIENT_ERRORS

_DUE = """
SELECT message_id FROM dead_letters
WHERE durable = $1 AND status = 'dead' AND next_replay_at <= clock_timestamp()
ORDER BY next_replay_at LIMIT $2
"""


def replay_bucket(rate: float) -> TokenBucket:
    """``rate`` tokens per second, one second's worth (at least one) saved up."""
    return TokenBucket(Limit(rate, default_burst(rate)), time.monotonic())


async def take_token(bucket: TokenBucket, stop: asyncio.Event) -> bool:
    """Wait for one token of ``bucket``; False if ``stop`` was set meanwhile."""
    while not stop.is_set():
        now = time.monotonic()
        wait = bucket.wait_for(1, now)
        if wait <= 0:
            bucket.take(1, now)
            return True
        await sleep_unless(stop, wait)
    return False


@dataclass
class ReplayerStats:
    """Counters the role exposes (and tests read)."""

    scans: int = 0
    replayed: int = 0
    settled: int = 0
    republished: int = 0
    skipped: int = 0
    errors: int = 0
    failed: int = 0
    parked: int = 0
    #: Failure-group count changes folded (migration 0027).
    folded: int = 0
    replayed_by_durable: dict[str, int] = field(default_factory=dict)


class DlqReplayer:
    """Replays one topology's dead letters by its policies."""

    def __init__(
        self,
        *,
        topology: Topology,
        pools: dict[str, Pool],
        js: JetStream,
        batch_size: int = 100,
        metrics: ReplayerMetrics | None = None,
        unconfirmed_after: float = UNCONFIRMED_AFTER,
    ) -> None:
        self.topology, self.pools, self.js, self.batch_size = topology, pools, js, batch_size
        self.unconfirmed_after = unconfirmed_after
        self.stats = ReplayerStats()
        self.metrics = metrics or ReplayerMetrics(RoleMetrics("dlq-replayer"))
        self.metrics.watch(self)
        self.buckets = {
            name: replay_bucket(spec.replay_limits.rate) for name, spec in topology.durables.items()
        }
        self.ready = False

    def automatic(self) -> list[str]:
        """Durables whose dead letters are replayed without an operator."""
        return sorted(n for n, d in self.topology.durables.items() if d.replay == "automatic")

    async def run(self, stop: asyncio.Event, *, interval: float) -> None:
        """Scan until ``stop``."""
        self.ready = True
        while not stop.is_set():
            try:
                await self.scan(stop)
            except ERRORS as exc:
                self.stats.errors += 1
                log.warning("scan failed (%s); trying again", exc)
            except Exception:  # one row's surprise must not end the replayer
                self.stats.failed += 1
                log.exception("scan failed unexpectedly; trying again")
            await sleep_unless(stop, interval)

    async def scan(self, stop: asyncio.Event) -> None:
        """One pass: settle finished replays, then replay what is due."""
        self.stats.scans += 1
        by_db: dict[str, list[str]] = {}
        for name, spec in sorted(self.topology.durables.items()):
            by_db.setdefault(self.topology.context(spec.target).database, []).append(name)
        for database, durables in by_db.items():
            async with self.pools[database].acquire() as conn:
                self.stats.settled += await dead_letters.settle_replayed(conn, durables)
                self.stats.folded += await dead_letters.fold_groups(conn)
                for durable in durables:  # operator replays too: finishing, not deciding
                    await self._republish(conn, durable)
        for durable in self.automatic():
            if stop.is_set():
                return
            await self._replay_due(durable, stop)

    async def _republish(self, conn: Conn, durable: str) -> None:
        try:
            self.stats.republished += await dead_letters.republish_unconfirmed(
                conn, self.js, durable, older_than=self.unconfirmed_after, topology=self.topology
            )
        except ERRORS as exc:
            self.stats.errors += 1
            log.warning("republishing unconfirmed replays of %s failed (%s)", durable, exc)

    async def _replay_due(self, durable: str, stop: asyncio.Event) -> None:
        spec = self.topology.durables[durable]
        pool = self.pools[self.topology.context(spec.target).database]
        async with pool.acquire() as conn:
            due = [r["message_id"] for r in await conn.fetch(_DUE, durable, self.batch_size)]
            for message_id in due:
                if not await take_token(self.buckets[durable], stop):
                    return
                try:
                    done = await dead_letters.replay(
                        conn,
                        self.js,
                        durable=durable,
                        message_id=message_id,
                        actor=ACTOR,
                        reason="automatic replay (REQ-059)",
                        automatic=True,
                        allowed=("dead",),
                        topology=self.topology,
                    )
                except dead_letters.NoEnvelope as exc:
                    await self._park(conn, durable, message_id, str(exc))
                    continue
                except dead_letters.NotReplayable as exc:
                    self.stats.skipped += 1  # another replica took it, or it changed meanwhile
                    log.info("skipped: %s", exc)
                    continue
                except ERRORS as exc:
                    # Marked 'replaying' (one attempt) and not confirmed: a later scan
                    # publishes it again. The rest of the batch waits for the stream.
                    self.stats.errors += 1
                    log.warning("replay of %s/%s not published (%s)", durable, message_id, exc)
                    return
                except Exception:  # this row's own problem: log it, count it, go on
                    self.stats.failed += 1
                    log.exception("replay of %s/%s failed unexpectedly", durable, message_id)
                    continue
                self.stats.replayed += 1
                by = self.stats.replayed_by_durable
                by[durable] = by.get(durable, 0) + 1
                log.info(
                    "replayed",
                    extra={
                        "durable": durable,
                        "message_id": str(message_id),
                        "replay_attempt": done.replay_attempt,
                    },
                )

    async def _park(self, conn: Conn, durable: str, message_id: UUID, why: str) -> None:
        """A dead letter with nothing to replay: parked for an operator, not retried
        every scan (it would hold the head of the due list for good)."""
        parked = await dead_letters.set_status(
            conn,
            durable=durable,
            message_id=message_id,
            status="parked",
            actor=ACTOR,
            reason=f"nothing to replay automatically: {why}"[:500],
        )
        if parked:
            self.stats.parked += 1
            log.warning("parked %s/%s: %s", durable, message_id, why)
