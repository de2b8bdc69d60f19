"""Module G: the archive worker (lane F→G, ``cg_g_archive``) and the replay worker
(``cg_replay``), both in G's database.

The archive is append-only. ``message_id`` is UNIQUE there as well, a second guard
behind ``handler_applied``: were the claim ever bypassed, the append would fail loudly
instead of archiving twice.

The replay worker executes the replay API's jobs (``replay_job_requested`` v1, INFRA-005
§1.4): each entry goes through :func:`shared.ops.dlq_change.replay_dead_letter`, the audited
path of ``ferry dlq replay`` (``dead_letter_actions`` with the job's actor and reason).
The inbox claim makes a job run once; a run cut short (a crash, a timeout) is rolled back
with its claim and runs again on redelivery, where the entries it already replayed are
refused as no longer replayable — counted, never replayed twice. Running jobs needs NATS
and the dead-letter databases: ``FERRY_HANDLER_REPLAY_JOBS=true`` (:class:`ReplayWorker`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from shared.adapters import dead_letters as dead_letter_store
from shared.adapters import replay_jobs
from shared.adapters.postgres import Conn, Statement, connect
from shared.contracts.events import handler_routes
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError, PoisonError, TransientError
from shared.ops.dlq import replay_dead_letter
from shared.runtime.settings import CommonSettings
from shared.sdk import Retry

from ..fields import business_json, text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

log = logging.getLogger("ferry.handlers.replay_jobs")

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_g_archive (
      id BIGSERIAL PRIMARY KEY,
      message_id UUID NOT NULL UNIQUE,
      opportunity_key TEXT NOT NULL,
      archived_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS handler_g_replays (
      message_id UUID PRIMARY KEY,
      opportunity_key TEXT NOT NULL,
      payload JSONB NOT NULL,
      requested_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)


@one_statement
def opportunity_archived_v1(request: HandleRequest) -> Statement:
    """Append the archived opportunity."""
    return Statement(
        "INSERT INTO handler_g_archive (message_id, opportunity_key) VALUES ($1, $2)",
        (uuid.UUID(request.message_id), text(request.payload, "opportunity_key")),
    )


@one_statement
def replay_requested_v1(request: HandleRequest) -> Statement:
    """Record a replay request."""
    return Statement(
        "INSERT INTO handler_g_replays (message_id, opportunity_key, payload)"
        " VALUES ($1, $2, $3::jsonb)",
        (
            uuid.UUID(request.message_id),
            text(request.payload, "opportunity_key"),
            business_json(request.payload),
        ),
    )


@dataclass
class ReplayWorker:
    """What executing replay jobs needs: settings (the DSNs of every database), the
    topology, a NATS connection and the pace (replays per second, 0: no pause)."""

    settings: CommonSettings
    topology: Topology
    nc: Any
    rate: float = 0.0

    async def run(self, claim: Conn, job_id: uuid.UUID) -> None:
        """Execute one job; its end is written on ``claim`` (it commits with the claim)."""
        if self.nc is None or not self.nc.is_connected:
            raise Retry("NATS is not connected: the replay job waits")
        database = self.topology.context(SPEC.name).database
        side = await connect(self.settings.dsn(database))
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


#: Set by ``python -m services.handlers --service module_g`` when
#: FERRY_HANDLER_REPLAY_JOBS is on (:func:`serve_replay_jobs`).
_WORKER: ReplayWorker | None = None


def serve_replay_jobs(worker: ReplayWorker | None) -> None:
    """Run replay jobs with ``worker`` (None: refuse them with 503 until one is set)."""
    global _WORKER
    _WORKER = worker


async def replay_job_requested_v1(conn: Conn, request: HandleRequest) -> None:
    """Execute a replay job (its entries are in ``replay_jobs``, written with the event)."""
    worker = _WORKER
    if worker is None:
        raise Retry(
            "this module_g handler does not run replay jobs: start it with "
            "FERRY_HANDLER_REPLAY_JOBS=true and its NATS user"
        )
    try:
        job_id = uuid.UUID(text(request.payload, "job_id"))
    except ValueError:
        raise PoisonError("INVALID_FIELD", "payload.job_id must be a UUID") from None
    await worker.run(conn, job_id)


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.module_g:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="module_g", tables=TABLES, routes=handler_routes(__name__, globals()))
