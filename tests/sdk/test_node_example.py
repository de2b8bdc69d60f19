"""The Node.js handler of docs/reference/handler-contract.md keeps the contract: run with
node, called by the SDK's signing test client as the consumer would call it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

from devstack.ports import free_port
from shared.sdk.testing import SigningClient
from tests.conftest import ROOT

HANDLER = Path(__file__).with_name("node_handler.mjs")
NODE = shutil.which("node")


def test_the_page_shows_the_tested_file() -> None:
    page = (ROOT / "docs/reference/handler-contract.md").read_text(encoding="utf-8")
    assert HANDLER.read_text(encoding="utf-8").strip() in page


async def test_the_node_handler_keeps_the_contract() -> None:
    # Never skipped: a machine without node fails here, naming what it lacks.
    assert NODE is not None, "node (Node.js) is needed to run the contract's Node example"
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "FERRY_HANDLER_SECRETS": json.dumps({"billing__from_shop": "s3cret"}),
    }
    proc = await asyncio.create_subprocess_exec(
        NODE, str(HANDLER), env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=20)
        assert line.strip() == b"listening"
        url = f"http://127.0.0.1:{port}/handle"
        async with SigningClient(url, durable="billing__from_shop", secret=b"s3cret") as ferry:
            call = ferry.call("order_paid", 1, {"order_id": "o-1"}, context="shop")
            assert (await ferry.send(call)).status == 200
            assert (await ferry.send(call.again())).status == 409
            assert (await ferry.send(call, secret=b"wrong")).status == 401
            assert (await ferry.send(call, signed_at=time.time() - 3600)).status == 401
            assert (await ferry.send(call, sign=False)).status == 401
            unknown = await ferry.send(ferry.call("order_lost", 1, {}, context="shop"))
            assert (unknown.status, unknown.body["reason_code"]) == (422, "UNKNOWN_EVENT")
            bad = await ferry.post(b"{not json", call.headers())
            assert (bad.status, bad.body["retryable"]) == (400, False)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)
