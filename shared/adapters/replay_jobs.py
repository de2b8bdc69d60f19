"""Replay jobs of the replay API's async mode (migrations/0013_replay_jobs.sql).

:func:`submit` writes a job row and the outbox row of its ``replay_job_requested`` event
in ONE transaction (no dual write: the job exists exactly when its event will be
published), idempotently by job id. The worker (module_g's handler, durable
``cg_replay``) then marks it :func:`started`, records each entry (:func:`progress`) and
:func:`finish`-es it, the last inside its inbox claim's transaction.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from shared.adapters.postgres import Conn
from shared.adapters.producer import record_event
from shared.contracts.replay_jobs import REPLAY_JOB_EVENT, REPLAY_JOB_VERSION

#: What a job row answers with (the API's JSON).
_COLUMNS = """
id, idempotency_key, request, entries, actor, reason, state, total, replayed, refused,
results, error, runs, created_at, started_at, finished_at, updated_at
"""

_INSERT = """
INSERT INTO replay_jobs (id, idempotency_key, request, request_hash, entries, actor, reason,
                         total)
VALUES ($1, $2, $3::jsonb, $4, $5::jsonb, $6, $7, $8)
ON CONFLICT (id) DO NOTHING
"""

_STARTED = """
UPDATE replay_jobs
SET state = 'running', runs = runs + 1, replayed = 0, refused = 0, results = '[]'::jsonb,
    error = NULL, started_at = clock_timestamp(), finished_at = NULL,
    updated_at = clock_timestamp()
WHERE id = $1 AND state IN ('queued', 'running', 'failed')
RETURNING entries, actor, reason, request
"""

_PROGRESS = """
UPDATE replay_jobs
SET replayed = $2, refused = $3, results = $4::jsonb, updated_at = clock_timestamp()
WHERE id = $1
"""

_FINISH = """
UPDATE replay_jobs
SET state = $2, replayed = $3, refused = $4, results = $5::jsonb, error = $6,
    finished_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = $1
"""

State = Literal["queued", "running", "done", "failed"]


class JobConflict(Exception):
    """The job id is taken by a different request."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(f"job {job['id']} exists with a different request")
        self.job = job


@dataclass(frozen=True)
class Submitted:
    """The outcome of :func:`submit`: the job, and whether this call created it."""

    job: dict[str, Any]
    created: bool


def request_hash(request: dict[str, Any]) -> str:
    """sha256 of the normalised request (sorted keys, no spaces)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _job(row: asyncpg.Record | None) -> dict[str, Any] | None:
    if row is None:
        return None
    doc = dict(row)
    for key in ("request", "entries", "results"):
        if isinstance(doc.get(key), str):
            doc[key] = json.loads(doc[key])
    return doc


async def get(conn: Conn, job_id: uuid.UUID) -> dict[str, Any] | None:
    """One job, or None."""
    return _job(await conn.fetchrow(f"SELECT {_COLUMNS} FROM replay_jobs WHERE id = $1", job_id))


async def recent(conn: Conn, limit: int = 50) -> list[dict[str, Any]]:
    """The latest jobs, newest first."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM replay_jobs ORDER BY created_at DESC LIMIT $1", limit
    )
    return [doc for doc in (_job(r) for r in rows) if doc is not None]


async def submit(
    conn: Conn,
    *,
    job_id: uuid.UUID,
    idempotency_key: str,
    request: dict[str, Any],
    entries: list[dict[str, str]],
    actor: str,
    reason: str,
    context: str,
) -> Submitted:
    """Record a job and its event in one transaction; the existing job when ``job_id`` was
    already submitted with the same request, :class:`JobConflict` when with another."""
    digest = request_hash(request)
    async with conn.transaction():
        status = await conn.execute(
            _INSERT,
            job_id,
            idempotency_key,
            json.dumps(request),
            digest,
            json.dumps(entries),
            actor,
            reason,
            len(entries),
        )
        if status.endswith(" 1"):
            await record_event(
                conn,
                aggregate_type="replay_job",
                aggregate_id=str(job_id),
                event_type=REPLAY_JOB_EVENT,
                event_version=REPLAY_JOB_VERSION,
                payload={"job_id": str(job_id), "entries": len(entries)},
                event_id=job_id,
                context=context,
            )
            created = True
        else:
            created = False
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS}, request_hash FROM replay_jobs WHERE id = $1", job_id
        )
    job = _job(row)
    assert job is not None
    if job.pop("request_hash") != digest:
        raise JobConflict(job)
    return Submitted(job, created)


async def started(conn: Conn, job_id: uuid.UUID) -> dict[str, Any] | None:
    """Mark a job running (again, after a crash: its counts start over); its entries,
    actor, reason and request, or None when there is no such job or it is done."""
    return _job(await conn.fetchrow(_STARTED, job_id))


async def progress(conn: Conn, job_id: uuid.UUID, results: list[dict[str, Any]]) -> None:
    """Record the entries handled so far."""
    replayed = sum(1 for r in results if r["outcome"] == "replayed")
    await conn.execute(_PROGRESS, job_id, replayed, len(results) - replayed, json.dumps(results))


async def finish(
    conn: Conn,
    job_id: uuid.UUID,
    results: list[dict[str, Any]],
    *,
    state: State = "done",
    error: str | None = None,
) -> None:
    """Record the job's end (on the claim's connection: it commits with the claim)."""
    replayed = sum(1 for r in results if r["outcome"] == "replayed")
    await conn.execute(
        _FINISH, job_id, state, replayed, len(results) - replayed, json.dumps(results), error
    )
