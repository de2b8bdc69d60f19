"""``python -m services.handlers`` as a real process: serve, drain on SIGTERM, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from devstack.ports import free_port, free_ports
from tests.conftest import ROOT, Env
from tests.helpers import eventually

from .conftest import HTTP_TIMEOUT, make_doc

pytestmark = pytest.mark.integration


def _spawn(world: Env, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    with open(world.tmp_path / "handler.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            argv := [sys.executable, "-m", "services.handlers", *args],
            cwd=ROOT,
            env=world.settings_env(command=argv, **extra),
            stdout=log,
            stderr=log,
        )


async def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()


async def _wait_ready(
    session: aiohttp.ClientSession, proc: subprocess.Popen[bytes], port: int
) -> None:
    async def ready() -> bool:
        assert proc.poll() is None, f"handler exited with {proc.returncode}"
        try:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(ready, timeout=30, what=f"handler ready on port {port}")


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT))


async def test_serves_and_drains_in_flight_calls_on_sigterm(env: Env) -> None:
    port = free_port()
    # The slow call needs the fault directives, which are off unless the setting says so.
    proc = _spawn(
        env, "--service", "sea", "--port", str(port), FERRY_HANDLER_FAULT_INJECTION="true"
    )
    try:
        async with _session() as session:
            await _wait_ready(session, proc, port)
            doc = make_doc(
                "vibe_created", 1, {"vibe_id": "v1", "title": "t", "_ferry_test": {"slow_ms": 1000}}
            )
            started = time.monotonic()
            call = asyncio.create_task(
                session.post(
                    f"http://127.0.0.1:{port}/handle",
                    json=doc,
                    headers={"Idempotency-Key": doc["message_id"]},
                )
            )
            await asyncio.sleep(0.3)  # the call is now sleeping inside the handler
            proc.send_signal(signal.SIGTERM)
            async with await call as resp:
                assert resp.status == 200, await resp.text()
            assert time.monotonic() - started >= 1.0, "the call was not in flight at SIGTERM"
        assert await _stop(proc) == 0
    finally:
        await _stop(proc)
    lines = [json.loads(line) for line in (env.tmp_path / "handler.log").read_text().splitlines()]
    assert {line["role"] for line in lines} == {"handler-sea"}


async def test_calls_past_the_drain_deadline_exit_4(env: Env) -> None:
    """The one role lifecycle: a call still in flight at FERRY_DRAIN_DEADLINE ends the
    drain with exit code 4, as for every role."""
    port = free_port()
    proc = _spawn(
        env, "--service", "sea", "--port", str(port), FERRY_HANDLER_FAULT_INJECTION="true",
        FERRY_DRAIN_DEADLINE="0.5",
    )  # fmt: skip
    try:
        async with _session() as session:
            await _wait_ready(session, proc, port)
            doc = make_doc(
                "vibe_created", 1, {"vibe_id": "v2", "title": "t", "_ferry_test": {"slow_ms": 5000}}
            )
            call = asyncio.create_task(
                session.post(
                    f"http://127.0.0.1:{port}/handle",
                    json=doc,
                    headers={"Idempotency-Key": doc["message_id"]},
                )
            )
            await asyncio.sleep(0.3)  # the call is now sleeping inside the handler
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            assert time.monotonic() - started < 4.0, "the drain outlived its deadline"
            call.cancel()
        assert code == 4
    finally:
        await _stop(proc)


async def test_answers_503_starting_until_its_database_answers(env: Env) -> None:
    """The one role lifecycle: the port opens at once; until PostgreSQL answers, readiness
    and calls get 503 "starting" (a call is retried, never a 500), health answers 200, and
    SIGTERM meanwhile stops it cleanly."""
    port, nowhere = free_ports(2)
    databases = {c.database: f"postgresql://x@127.0.0.1:{nowhere}/{c.database}"
                 for c in env.topology.contexts.values()}  # fmt: skip
    proc = _spawn(
        env, "--service", "sea", "--port", str(port), FERRY_DATABASES=json.dumps(databases)
    )
    try:
        async with _session() as session:

            async def listening() -> bool:
                assert proc.poll() is None, f"handler exited with {proc.returncode}"
                try:
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(listening, timeout=30, what="the handler's port open")
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 503
                assert (await resp.json())["failing"] == ["starting"]
            doc = make_doc("vibe_created", 1, {"vibe_id": "v3", "title": "t"})
            async with session.post(
                f"http://127.0.0.1:{port}/handle", json=doc,
                headers={"Idempotency-Key": doc["message_id"]},
            ) as resp:  # fmt: skip
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                assert (await resp.json())["retryable"] is True
        assert await _stop(proc) == 0
    finally:
        await _stop(proc)


async def test_listens_on_every_port_the_topology_names(mediation_env: Env) -> None:
    archive_port, replay_port = free_ports(2)
    durables = mediation_env.doc["durables"]
    durables["cg_g_archive"]["handler"]["url"] = f"http://127.0.0.1:{archive_port}/handle"
    durables["cg_replay"]["handler"]["url"] = f"http://127.0.0.1:{replay_port}/handle"
    mediation_env.write()
    proc = _spawn(mediation_env, "--service", "module_g")
    try:
        async with _session() as session:
            for port in (archive_port, replay_port):
                await _wait_ready(session, proc, port)
    finally:
        assert await _stop(proc) == 0


def _run(*args: str, **extra: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_TOPOLOGY=str(ROOT / "topologies/sea-vibespro.yaml"), PYTHONPATH=str(ROOT))
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "services.handlers", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "extra", "message"),
    [
        (("--service", "nope"), {}, b"no handler service 'nope'"),
        (("--service", "module_f"), {}, b"has no context 'module_f'"),
        ((), {}, b"no service given"),
        ((), {"FERRY_SERVICE": "sea", "FERRY_PORT": "http"}, b"invalid settings"),
        (
            ("--service", "sea"),
            {"FERRY_HANDLER_FAULT_INJECTION": "true", "FERRY_ENVIRONMENT": "production"},
            b"FERRY_HANDLER_FAULT_INJECTION=true is refused when FERRY_ENVIRONMENT is",
        ),
    ],
)
def test_configuration_errors_exit_2(
    args: tuple[str, ...], extra: dict[str, str], message: bytes
) -> None:
    result = _run(*args, **extra)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


async def test_a_port_in_use_exits_2(env: Env) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _spawn(env, "--service", "sea", "--port", str(port))
        code = await asyncio.to_thread(proc.wait, 30)
    assert code == 2
    assert "cannot listen on 127.0.0.1" in (env.tmp_path / "handler.log").read_text()


async def test_port_zero_logs_the_port_it_got(env: Env) -> None:
    proc = _spawn(env, "--service", "vibespro", "--port", "0")
    log_path = env.tmp_path / "handler.log"

    async def serving() -> bool:
        assert proc.poll() is None, f"handler exited with {proc.returncode}"
        return "serving on" in (log_path.read_text() if log_path.exists() else "")

    try:
        await eventually(serving, timeout=30, what="the 'serving on' log line")
        (line,) = [json.loads(x) for x in log_path.read_text().splitlines() if "serving on" in x]
        port = int(line["message"].rsplit(":", 1)[1].split("/")[0])
        assert port > 0
        async with _session() as session:
            await _wait_ready(session, proc, port)
    finally:
        assert await _stop(proc) == 0
