"""The bench's child processes: roles, workers and the OTLP sink, each in its own session.

:func:`spawn` starts a long-running process with its output in a log file;
:func:`run_worker` runs a worker (``python -m bench.X``) to its end and returns the one
result line it printed; :func:`kill_leftovers` cleans up after an interrupted run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import PROGRESS_PREFIX, ROOT, parse_result
from shared.runtime.loop import LOOP_VARIABLE
from shared.waits import within

PYTHON = sys.executable
#: Longest wait for a role to answer /readyz.
READY_TIMEOUT = 60.0
#: SIGTERM, then this long for the drain, then SIGKILL.
STOP_TIMEOUT = 20.0
#: Process groups of every child still running, for :func:`kill_leftovers`.
_CHILDREN: set[int] = set()


def kill_leftovers() -> None:
    """SIGKILL every child process group still alive (after an interrupted run)."""
    for pgid in list(_CHILDREN):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _CHILDREN.discard(pgid)


@dataclass
class Proc:
    """A child process the bench started (a role, a worker, the OTLP sink)."""

    name: str
    kind: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.returncode is None

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> int:
        """SIGTERM, wait for its drain, SIGKILL if it outlives STOP_TIMEOUT."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await within(STOP_TIMEOUT, self.process.wait())
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        _CHILDREN.discard(self.pid)
        return int(self.process.returncode or 0)


async def spawn(
    name: str, kind: str, argv: Sequence[str], env: Mapping[str, str], logs: Path
) -> Proc:
    """Start ``argv`` in its own session, output to ``logs/<name>.log`` (``logs`` exists)."""
    log_path = logs / f"{name}.log"
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    _CHILDREN.add(process.pid)
    return Proc(name, kind, process, log_path)


async def run_worker(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    on_start: Callable[[int], None] | None = None,
    echo: bool = True,
) -> dict[str, Any]:
    """Run a worker (``python -m bench.X``) to its end and return the result it printed.

    Its progress lines (:func:`bench.common.progress`) are echoed as they come, its
    other output kept for the error message; ``on_start`` gets its pid.
    """
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    _CHILDREN.add(process.pid)
    if on_start is not None:
        on_start(process.pid)
    assert process.stdout is not None and process.stderr is not None
    tail: list[str] = []

    async def pump(stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if line.startswith(PROGRESS_PREFIX):
                if echo:
                    print(f"      {line[len(PROGRESS_PREFIX) :]}", flush=True)
                continue
            tail.append(line)
            del tail[:-20]

    stdout_task = asyncio.create_task(process.stdout.read())
    await pump(process.stderr)
    stdout = (await stdout_task).decode(errors="replace")
    code = await process.wait()
    _CHILDREN.discard(process.pid)
    if code != 0:
        raise RuntimeError(f"{name} exited with {code}: " + " | ".join(tail[-8:]))
    return parse_result(stdout)


def clean_environ() -> dict[str, str]:
    """This environment without FERRY_* and OTEL_* (the bench sets those), repo on the path.

    FERRY_EVENT_LOOP stays: set for the bench, it is the loop of every process it starts
    (roles, baselines, bare-bones pipeline), so each ratio compares like with like.
    """
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FERRY_", "OTEL_", "PYTHONPATH"))
    }
    if LOOP_VARIABLE in os.environ:
        env[LOOP_VARIABLE] = os.environ[LOOP_VARIABLE]
    env["PYTHONPATH"] = str(ROOT)
    return env


async def wait_http(
    url: str, proc: Proc, *, timeout: float = READY_TIMEOUT, tls: ssl.SSLContext | None = None
) -> None:
    """Poll ``url`` until it answers 200; fail naming the process if it dies or stalls.

    ``tls``: the context that verifies an ``https://`` URL (a handler serving HTTPS)."""
    deadline = time.monotonic() + timeout
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=2)
    ) as session:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited early:\n{proc.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.log_tail()}")
