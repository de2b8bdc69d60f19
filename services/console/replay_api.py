"""The replay API's async mode (INFRA-005 §1.4, issue 26): replay jobs over HTTP.

``POST /api/replay-jobs`` takes a JSON request for a set of dead letters — one durable's
message ids, or a failure group of the Failures page (durable, reason code, fingerprint)
— and answers **202** at once with the job's id. Nothing is replayed in the request: the
console writes the job row (``replay_jobs``) and the outbox row of its
``replay_job_requested`` event in ONE transaction in the replay lane's database
(mediation: module_g); the outbox-publisher puts the event on ``mediation.replay.jobs``,
and the durable ``cg_replay`` hands it to module_g's handler, which replays each entry
through ``ferry dlq replay``'s audited path and records the outcome in the job row.

Jobs are idempotent by id: the ``Idempotency-Key`` header (or ``job_id`` in the body)
names the job — a UUID is the id itself, any other key is mapped to one (uuid5). The same
id with the same request is the same job (200 and its status); with another request, 409.
``GET /api/replay-jobs/{id}`` answers its status, ``GET /api/replay-jobs`` the latest;
``/replay-jobs`` and ``/replay-jobs/{id}`` show them as pages.

The request (every field but ``reason`` optional unless said)::

    {"durable": "cg_f_ingest", "message_ids": ["<uuid>", ...], "reason": "why"}
    {"group": {"durable": "cg_f_ingest", "reason_code": "HANDLER_REJECTED",
               "fingerprint": "<12 hex>"}, "limit": 100, "reason": "why"}
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shared.adapters import dead_letters as store
from shared.adapters import replay_jobs
from shared.contracts.replay_jobs import REPLAY_JOB_EVENT, REPLAY_JOB_VERSION, replay_lane
from shared.ops import dlq as dlq_ops

from . import data
from .host import Host

#: Most dead letters one job may name (message ids, or a group's entries taken): a job
#: runs within one handler call of cg_replay (its timeout is 60 s).
MAX_IDS = 100
#: Longest reason and idempotency key accepted.
MAX_REASON, MAX_KEY = 500, 200
#: Largest request body (bytes).
MAX_BODY = 64 * 1024
#: The namespace that turns a non-UUID Idempotency-Key into a job id.
KEY_NAMESPACE = uuid.UUID("6f0d3c2e-8a51-4c1b-9a7e-26f3c5e0b1d4")
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{12}$")
_FIELDS = frozenset({"durable", "message_ids", "group", "limit", "reason", "job_id"})
_GROUP_FIELDS = frozenset({"durable", "reason_code", "fingerprint"})


class ApiError(Exception):
    """A request the API refuses: its status and what is wrong, in words."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra

    def response(self) -> web.Response:
        """The JSON answer."""
        return web.json_response({"error": str(self), **self.extra}, status=self.status)


@dataclass(frozen=True)
class ReplayRequest:
    """A parsed replay request: a durable's message ids, or a failure group."""

    reason: str
    durable: str
    message_ids: tuple[uuid.UUID, ...] = ()
    group: data.GroupKey | None = None
    limit: int = MAX_IDS
    job_id: uuid.UUID | None = None

    def normalised(self) -> dict[str, Any]:
        """The request as stored and hashed (the same request always reads the same)."""
        if self.group is not None:
            return {
                "group": {
                    "durable": self.group.durable,
                    "reason_code": self.group.reason,
                    "fingerprint": self.group.fingerprint,
                },
                "limit": self.limit,
                "reason": self.reason,
            }
        return {
            "durable": self.durable,
            "message_ids": [str(m) for m in self.message_ids],
            "reason": self.reason,
        }


def job_id_of(key: str) -> uuid.UUID:
    """The job id an idempotency key names: the key itself when it is a UUID, else its
    uuid5; :class:`ApiError` 400 for a key that is empty, too long or not printable."""
    if not _KEY.match(key):
        raise ApiError(
            400,
            f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII characters without spaces",
        )
    try:
        return uuid.UUID(key)
    except ValueError:
        return uuid.uuid5(KEY_NAMESPACE, key)


def _text(doc: dict[str, Any], name: str, where: str = "") -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, f"{where}{name} must be a non-empty string")
    return value.strip()


def _durable(name: str, durables: Collection[str]) -> str:
    if name not in durables:
        raise ApiError(422, f"unknown durable {name!r} (known: {', '.join(sorted(durables))})")
    return name


def _message_ids(value: Any) -> tuple[uuid.UUID, ...]:
    if not isinstance(value, list):
        raise ApiError(400, "message_ids must be a list of message ids (UUIDs)")
    if not value:
        raise ApiError(400, "message_ids is empty: name at least one dead letter")
    if len(value) > MAX_IDS:
        raise ApiError(
            422,
            f"too many message ids: {len(value)}, at most {MAX_IDS} per job "
            "(split them, or replay their group)",
        )
    ids: dict[uuid.UUID, None] = {}
    for item in value:
        try:
            ids[uuid.UUID(item)] = None
        except (ValueError, TypeError, AttributeError):
            shown = json.dumps(item)[:80]
            raise ApiError(400, f"message_ids: {shown} is not a message id (UUID)") from None
    return tuple(sorted(ids, key=str))


def _limit(value: Any) -> int:
    if value is None:
        return MAX_IDS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_IDS:
        raise ApiError(400, f"limit must be an integer from 1 to {MAX_IDS}")
    return value


def _group(value: Any, durables: Collection[str]) -> data.GroupKey:
    if not isinstance(value, dict):
        raise ApiError(400, "group must be an object: durable, reason_code, fingerprint")
    unknown = sorted(set(value) - _GROUP_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown field(s) in group: {', '.join(unknown)}")
    durable = _durable(_text(value, "durable", "group."), durables)
    reason = _text(value, "reason_code", "group.")
    fingerprint = _text(value, "fingerprint", "group.")
    if not _FINGERPRINT.match(fingerprint):
        raise ApiError(400, "group.fingerprint must be 12 hex digits (as the Failures page shows)")
    return data.GroupKey(durable, reason, fingerprint)


def _load(body: bytes) -> dict[str, Any]:
    """The body as a JSON object of known fields."""
    if len(body) > MAX_BODY:
        raise ApiError(413, f"request body over {MAX_BODY} bytes")
    try:
        doc = json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not UTF-8 JSON") from None
    except ValueError as exc:
        raise ApiError(400, f"request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "request body must be a JSON object")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise ApiError(
            400, f"unknown field(s): {', '.join(unknown)} (known: {', '.join(sorted(_FIELDS))})"
        )
    return doc


def parse_request(body: bytes, durables: Collection[str]) -> ReplayRequest:
    """A replay request from a JSON body; :class:`ApiError` naming what is wrong (400 for
    a malformed request, 422 for an unknown durable or too many ids)."""
    doc = _load(body)
    reason = _text(doc, "reason")
    if len(reason) > MAX_REASON:
        raise ApiError(400, f"reason is longer than {MAX_REASON} characters")
    job_id = None
    if "job_id" in doc:
        job_id = job_id_of(_text(doc, "job_id"))
    if ("group" in doc) == ("message_ids" in doc):
        raise ApiError(400, "give either message_ids (with durable) or group, not both or neither")
    if "group" in doc:
        if "durable" in doc:
            raise ApiError(400, "durable goes inside group for a group request")
        group = _group(doc["group"], durables)
        return ReplayRequest(
            reason, group.durable, group=group, limit=_limit(doc.get("limit")), job_id=job_id
        )
    if "limit" in doc:
        raise ApiError(400, "limit applies to a group request only")
    durable = _durable(_text(doc, "durable"), durables)
    return ReplayRequest(reason, durable, message_ids=_message_ids(doc["message_ids"]),
                         job_id=job_id)  # fmt: skip


def job_view(job: dict[str, Any]) -> dict[str, Any]:
    """A job as the API answers it."""
    job_id = str(job["id"])
    return {
        "job_id": job_id,
        "state": job["state"],
        "total": job["total"],
        "replayed": job["replayed"],
        "refused": job["refused"],
        "actor": job["actor"],
        "reason": job["reason"],
        "request": job["request"],
        "entries": job["entries"],
        "results": job["results"],
        "error": job["error"],
        "runs": job["runs"],
        "created_at": _iso(job["created_at"]),
        "started_at": _iso(job["started_at"]),
        "finished_at": _iso(job["finished_at"]),
        "links": {"self": f"/api/replay-jobs/{job_id}", "page": f"/replay-jobs/{job_id}"},
    }


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


class ReplayApi:
    """The replay API's routes on one console."""

    def __init__(self, console: Host) -> None:
        self.console = console

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register the API and its pages."""
        router.add_post("/api/replay-jobs", self.submit)
        router.add_get("/api/replay-jobs", self.list_json)
        router.add_get("/api/replay-jobs/{job_id}", self.get_json)
        router.add_get("/replay-jobs", self.list_page)
        router.add_get("/replay-jobs/{job_id}", self.job_page)

    def _lane_pool(self) -> tuple[Any, str]:
        topology = self.console.topology
        lane = replay_lane(topology)
        if lane is None:
            raise ApiError(
                404,
                f"topology {topology.name} has no replay lane: no context publishes "
                f"{REPLAY_JOB_EVENT} v{REPLAY_JOB_VERSION}",
            )
        return self.console.pools[lane.database], lane.context

    async def _entries(self, request: ReplayRequest) -> list[dict[str, str]]:
        """The dead letters the request names, as the job will replay them."""
        if request.group is not None:
            rows, _ = await data.group_entries(
                self.console.topology,
                self.console.pools,
                request.group,
                list(data.OPEN_STATUSES),
                limit=request.limit,
            )
            if not rows:
                key = request.group
                raise ApiError(
                    404,
                    f"unknown group: no open dead letters of {key.durable} with reason "
                    f"{key.reason} and fingerprint {key.fingerprint}",
                )
        else:
            query = store.Query(durables=[request.durable], message_ids=list(request.message_ids))
            rows = await dlq_ops.find_dead_letters(self.console.settings, query)
            found = {r["message_id"] for r in rows}
            missing = [str(m) for m in request.message_ids if m not in found]
            if missing:
                raise ApiError(
                    422,
                    f"no dead letter {request.durable}/{missing[0]}"
                    + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                    missing=missing,
                )
        return [{"durable": r["durable"], "message_id": str(r["message_id"])} for r in rows]

    async def submit(self, request: web.Request) -> web.Response:
        """``POST /api/replay-jobs``: accept a job (202), or answer for an existing one."""
        try:
            session = self.console.session_of(request)
            if not session.may_act:
                raise ApiError(
                    403, f"{session.user} is read-only: only an operator may start a replay job"
                )
            pool, context = self._lane_pool()
            parsed = parse_request(await request.read(), self.console.topology.durables)
            key = request.headers.get("Idempotency-Key")
            job_id = parsed.job_id
            if key is not None:
                from_header = job_id_of(key.strip())
                if job_id is not None and job_id != from_header:
                    raise ApiError(400, "Idempotency-Key and job_id name different jobs")
                job_id = from_header
            given = key.strip() if key is not None else None
            job_id = job_id or uuid.uuid4()
            async with pool.acquire() as conn:
                existing = await replay_jobs.get(conn, job_id)
            if existing is not None:
                # Known already: the same request answers its job, another one conflicts,
                # whatever the dead letters look like now.
                if existing["request"] != parsed.normalised():
                    raise self._conflict(existing)
                return self._answer(existing, 200)
            entries = await self._entries(parsed)
            async with pool.acquire() as conn:
                done = await replay_jobs.submit(
                    conn,
                    job_id=job_id,
                    idempotency_key=given or str(job_id),
                    request=parsed.normalised(),
                    entries=entries,
                    actor=session.actor,
                    reason=parsed.reason,
                    context=context,
                )
        except ApiError as exc:
            self.console.actions.labels("replay_job", "refused").inc()
            return exc.response()
        except replay_jobs.JobConflict as exc:
            return self._conflict(exc.job).response()
        self.console.actions.labels("replay_job", "accepted" if done.created else "repeated").inc()
        if done.created:
            self.console.log_action(
                f"replay job {job_id} accepted ({len(entries)} entries): {parsed.reason}",
                session.actor,
            )
        return self._answer(done.job, 202 if done.created else 200)

    def _conflict(self, job: dict[str, Any]) -> ApiError:
        return ApiError(
            409,
            f"job {job['id']} exists with another request: an idempotency key names one "
            "request; use a new key for a new request",
            job_id=str(job["id"]),
            request=job["request"],
        )

    def _answer(self, job: dict[str, Any], status: int) -> web.Response:
        view = job_view(job)
        return web.json_response(view, status=status, headers={"Location": view["links"]["self"]})

    async def _job(self, request: web.Request) -> dict[str, Any]:
        try:
            job_id = uuid.UUID(request.match_info["job_id"])
        except ValueError:
            raise ApiError(404, "no such replay job (job ids are UUIDs)") from None
        pool, _ = self._lane_pool()
        async with pool.acquire() as conn:
            job = await replay_jobs.get(conn, job_id)
        if job is None:
            raise ApiError(404, f"no replay job {job_id}")
        return job

    async def get_json(self, request: web.Request) -> web.Response:
        """``GET /api/replay-jobs/{id}``: the job's status."""
        try:
            return web.json_response(job_view(await self._job(request)))
        except ApiError as exc:
            return exc.response()

    async def list_json(self, request: web.Request) -> web.Response:
        """``GET /api/replay-jobs``: the latest jobs, newest first."""
        try:
            pool, _ = self._lane_pool()
        except ApiError as exc:
            return exc.response()
        async with pool.acquire() as conn:
            jobs = await replay_jobs.recent(conn)
        return web.json_response({"jobs": [job_view(j) for j in jobs]})

    async def list_page(self, request: web.Request) -> web.Response:
        """The Replay jobs page."""
        jobs: list[dict[str, Any]] = []
        lane = replay_lane(self.console.topology)
        if lane is not None:
            async with self.console.pools[lane.database].acquire() as conn:
                jobs = await replay_jobs.recent(conn)
        live = any(j["state"] in ("queued", "running") for j in jobs)
        return self.console.render(request, "replay_jobs.html", jobs=jobs, lane=lane, refresh=live)

    async def job_page(self, request: web.Request) -> web.Response:
        """One replay job's page: state, counts, each entry's outcome."""
        try:
            job = await self._job(request)
        except ApiError as exc:
            return self.console.error_page(request, str(exc), exc.status)
        outcomes = {(r["durable"], r["message_id"]): r for r in job["results"]}
        rows = [(e, outcomes.get((e["durable"], e["message_id"]))) for e in job["entries"]]
        return self.console.render(
            request,
            "replay_job.html",
            job=job,
            rows=rows,
            refresh=job["state"] in ("queued", "running"),
        )
