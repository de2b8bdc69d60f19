"""A topology without a replay lane (sea-vibespro: nobody publishes replay_job_requested)
has no replay API: the console says so, in JSON and on its page, and touches no database."""

from __future__ import annotations

import html

from aiohttp.test_utils import TestClient, TestServer

from services.console.app import Console
from services.console.auth import Authenticator
from services.console.settings import ConsoleSettings
from shared.contracts.loading import load_topology
from shared.contracts.replay_jobs import replay_lane
from shared.runtime.metrics import RoleMetrics
from tests.conftest import ROOT

TOKEN = "no-lane-token"


async def test_a_topology_without_a_replay_lane_refuses_jobs_in_words() -> None:
    topology = load_topology(ROOT / "topologies/sea-vibespro.yaml")
    assert replay_lane(topology) is None
    assert replay_lane(load_topology(ROOT / "topologies/mediation.yaml")) is not None
    auth = Authenticator({}, token=TOKEN, token_role="operator")
    console = Console(ConsoleSettings(), topology, {}, lambda: None, auth, RoleMetrics("console"))
    console.ready = True  # started (no pools to open): pages answer, not 503 "starting"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(console.app())) as client:
        body = {"durable": "sea__from_vibespro", "message_ids": [], "reason": "x"}
        resp = await client.post("/api/replay-jobs", json=body, headers=headers)
        assert resp.status == 404
        assert "has no replay lane" in (await resp.json())["error"]
        resp = await client.get("/api/replay-jobs", headers=headers)
        assert resp.status == 404
        resp = await client.get("/replay-jobs", headers=headers)
        assert resp.status == 200
        assert "has no replay lane" in html.unescape(await resp.text())
        resp = await client.get("/api/replay-jobs")
        assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
