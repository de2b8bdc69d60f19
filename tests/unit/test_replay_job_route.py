"""The replay API's job worker is the platform's (issue 43): module G's example handler
only re-exports the unbound route its manifest names; the handler role binds a worker."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest

from services.handlers.contexts import module_g
from shared.adapters.postgres import Conn
from shared.contracts.replay_jobs import REPLAY_JOB_EVENT, REPLAY_JOB_VERSION
from shared.domain.envelope import Envelope
from shared.domain.errors import PoisonError
from shared.ops import replay_jobs
from shared.sdk import Call, Retry
from shared.sdk.request import Delivery


def _call(payload: dict[str, Any]) -> Call[dict[str, Any]]:
    return Call(
        envelope=cast(Envelope, None), delivery=cast(Delivery, None), doc={}, payload=payload
    )


#: No connection: neither route touches the claim here.
NO_CONN = cast(Conn, None)


class FakeWorker:
    def __init__(self) -> None:
        self.ran: list[uuid.UUID] = []

    async def run(self, claim: Any, job_id: uuid.UUID) -> None:
        self.ran.append(job_id)


def test_module_g_routes_jobs_to_the_platforms_unbound_route() -> None:
    route = module_g.SPEC.routes[(REPLAY_JOB_EVENT, REPLAY_JOB_VERSION)]
    assert route is replay_jobs.replay_job_requested_v1
    assert replay_jobs.replay_job_route(None) is route
    assert not hasattr(module_g, "ReplayWorker") and not hasattr(module_g, "_WORKER")


async def test_unbound_jobs_wait_with_503() -> None:
    with pytest.raises(Retry):
        await replay_jobs.replay_job_requested_v1(NO_CONN, _call({"job_id": str(uuid.uuid4())}))


async def test_a_bound_route_runs_the_job_on_its_worker() -> None:
    worker = FakeWorker()
    route = replay_jobs.replay_job_route(cast(replay_jobs.ReplayJobWorker, worker))
    job_id = uuid.uuid4()
    await route(NO_CONN, _call({"job_id": str(job_id), "entries": 2}))
    assert worker.ran == [job_id]
    for bad in ({"job_id": "nope"}, {"job_id": ""}, {}):
        with pytest.raises(PoisonError):
            await route(NO_CONN, _call(bad))
    assert worker.ran == [job_id]
