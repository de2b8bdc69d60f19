"""The replay API's job worker (INFRA-005 §1.4, issue 43): a platform use-case.

A job (``replay_job_requested`` v1, :mod:`shared.contracts.replay_jobs`) reaches the
handler of a replay-worker context through its durable (mediation: ``cg_replay`` →
module_g). The handler role hosts the worker when FERRY_HANDLER_REPLAY_JOBS is on
(``python -m services.handlers``): it builds a :class:`ReplayJobWorker` and binds it to the
route with :func:`replay_job_route`. The route a manifest names,
:func:`replay_job_requested_v1`, is the unbound one: it answers 503 until a worker is
bound, so a job waits for a handler that runs them.

Each entry goes through :func:`shared.ops.dlq_change.replay_dead_letter`, the audited path
of ``ferry dlq replay`` (``dead_letter_actions`` with the job's actor and reason). The
inbox claim makes a job run once; a run cut short (a crash, a timeout) is rolled back with
its claim and runs again on redelivery, where the entries it already replayed are refused
as no longer replayable — counted, never replayed twice.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shared.adapters import dead_letters as dead_letter_store
from shared.adapters import replay_jobs
from shared.adapters.postgres import Conn, connect
from shared.contracts.replay_jobs import replay_lane
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError, PoisonError, TransientError
from shared.ops.dlq_change import replay_dead_letter
from shared.runtime.settings import CommonSettings
from shared.sdk import Call, Retry

log = logging.getLogger("ferry.handlers.replay_jobs")

#: A route of a handler service: the claim's connection and the call.
JobRoute = Callable[[Conn, Call[dict[str, Any]]], Awaitable[None]]


@dataclass
class ReplayJobWorker:
    """What executing replay jobs needs: settings (the DSNs of every database), the
    topology, a NATS connection and the pace (replays per second, 0: no pause)."""

    settings: CommonSettings
    topology: Topology
    nc: Any
    rate: float = 0.0

    def __post_init__(self) -> None:
        lane = replay_lane(self.topology)
        if lane is None:
            raise ConfigurationError(f"topology {self.topology.name!r} runs no replay jobs")
        #: The database of the job rows (the lane's), which is the worker's own.
        self.database = lane.database

    async def run(self, claim: Conn, job_id: uuid.UUID) -> None:
        """Execute one job; its end is written on ``claim`` (it commits with the claim)."""
        if self.nc is None or not self.nc.is_connected:
            raise Retry("NATS is not connected: the replay job waits")
        side = await connect(self.settings.dsn(self.database))
        try:
            # Committed at once (not in the claim's transaction): GET shows it running.
            job = await replay_jobs.started(side, job_id)
            if job is None:
                log.warning("replay job %s: no such job, or already finished", job_id)
                return
            results: list[dict[str, Any]] = []
            try:
                for index, entry in enumerate(job["entries"]):
                    if index and self.rate > 0:
                        await asyncio.sleep(1.0 / self.rate)
                    results.append(await self._one(entry, job["actor"], job["reason"], job_id))
                    await replay_jobs.progress(side, job_id, results)
            except Exception as exc:
                # The claim rolls back and the job runs again on redelivery; until then
                # (or for good, once the ladder is spent) it shows failed, with why.
                await replay_jobs.finish(
                    side, job_id, results, state="failed", error=f"{type(exc).__name__}: {exc}"
                )
                raise
        finally:
            await side.close()
        await replay_jobs.finish(claim, job_id, results)
        replayed = sum(1 for r in results if r["outcome"] == "replayed")
        log.info("replay job %s done: %s replayed, %s refused", job_id, replayed,
                 len(results) - replayed, extra={"actor": job["actor"]})  # fmt: skip

    async def _one(
        self, entry: dict[str, Any], actor: str, reason: str, job_id: uuid.UUID
    ) -> dict[str, Any]:
        row = {"durable": entry["durable"], "message_id": uuid.UUID(entry["message_id"])}
        done = {"durable": entry["durable"], "message_id": entry["message_id"]}
        try:
            replayed = await replay_dead_letter(
                self.settings,
                self.topology,
                self.nc,
                row,
                actor=actor,
                reason=f"{reason} (replay job {job_id})",
            )
        except dead_letter_store.NotReplayable as exc:
            return {**done, "outcome": "refused", "reason": str(exc)}
        except (TransientError, ConfigurationError, OSError, TimeoutError) as exc:
            return {**done, "outcome": "refused", "reason": f"not replayed now: {exc}"}
        return {**done, "outcome": "replayed", "subject": replayed.subject}


def job_id_of(call: Call[dict[str, Any]]) -> uuid.UUID:
    """The job id of a ``replay_job_requested`` call (a poison when not a UUID)."""
    value = call.payload.get("job_id")
    if not isinstance(value, str) or not value:
        raise PoisonError("INVALID_FIELD", "payload.job_id must be a non-empty string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise PoisonError("INVALID_FIELD", "payload.job_id must be a UUID") from None


def replay_job_route(worker: ReplayJobWorker | None) -> JobRoute:
    """The route executing replay jobs with ``worker`` (None: :func:`replay_job_requested_v1`,
    refusing them with 503 until a handler that runs them takes them)."""
    if worker is None:
        return replay_job_requested_v1

    async def replay_job_requested(conn: Conn, call: Call[dict[str, Any]]) -> None:
        """Execute a replay job (its entries are in ``replay_jobs``, written with the event)."""
        await worker.run(conn, job_id_of(call))

    return replay_job_requested


async def replay_job_requested_v1(conn: Conn, call: Call[dict[str, Any]]) -> None:
    """The replay-job route unbound: every job waits (503) for a handler running them."""
    raise Retry(
        "this handler does not run replay jobs: start it with "
        "FERRY_HANDLER_REPLAY_JOBS=true and its NATS user"
    )
