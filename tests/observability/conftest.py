"""Observability fixtures: an in-memory span exporter, worlds with the real handler service.

The tracing fixture installs a real SDK tracer provider as Ferry's (and instruments
asyncpg and aiohttp into it) for one test, then removes it, so tests that do not ask for
it run with tracing off, as production does by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from nats.aio.client import Client as NATS
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devstack.ports import free_port
from services.handlers.app import make_app
from services.handlers.service import build_service
from services.handlers.specs import service_spec
from shared import telemetry
from shared.access.streams import provision
from tests.conftest import CAPS, ROOT, Env
from tests.consumer.conftest import ScriptedHandler, fast_durable, handler
from tests.helpers import eventually

__all__ = ["handler"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Ferry's tracing on, every span kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "ferry-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    telemetry.instrument(provider)
    try:
        yield exporter
    finally:
        telemetry.uninstrument()
        telemetry.use_tracer_provider(None)
        provider.shutdown()


@dataclass
class HandlerApp:
    """The real example handler service of a context, served in-process."""

    url: str
    port: int


@contextlib.asynccontextmanager
async def handler_app(
    env: Env, context: str, *, fault_injection: bool = False
) -> AsyncIterator[HandlerApp]:
    """``services.handlers`` for ``context`` on a free port (same code as the role); with
    ``fault_injection``, obeying ``_ferry_test`` as FERRY_HANDLER_FAULT_INJECTION=true does."""
    pool = await asyncpg.create_pool(env.dsn(context), min_size=1, max_size=4)
    port = free_port()
    service = build_service(
        service_spec(context), pool=pool, topology=env.topology, fault_injection=fault_injection
    )
    runner = web.AppRunner(make_app(service=service), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield HandlerApp(f"http://127.0.0.1:{port}/handle", port)
    finally:
        await runner.cleanup()
        await pool.close()


@pytest.fixture
async def sea_world(env: Env, nc: NATS, handler: ScriptedHandler) -> Env:
    """sea-vibespro provisioned, durable sea__from_vibespro on test clocks."""
    fast_durable(env, handler.url)
    await provision(nc.jetstream(), env.topology, caps=CAPS)
    return env


def trace_spans(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    """Finished spans of one trace, oldest first."""
    found = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    return sorted(found, key=lambda s: s.start_time or 0)


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    """The one span called ``name`` (fails naming the spans there are)."""
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans {name!r} among {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


class Roles:
    """Role processes (``python -m services.X``) of one test, stopped with SIGTERM."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], **extra: str) -> subprocess.Popen[bytes]:
        with open(self.env.tmp_path / f"{name}.log", "ab") as log:  # the child keeps a copy
            proc = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=ROOT,
                env=self.env.settings_env(**extra),
                stdout=log,
                stderr=log,
            )
        self.procs[name] = proc
        return proc

    def log_lines(self, name: str) -> list[str]:
        return (self.env.tmp_path / f"{name}.log").read_text().splitlines()

    async def stop(self, name: str) -> int:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(proc.wait, 20)
        finally:
            if proc.poll() is None:
                proc.kill()

    async def stop_all(self) -> None:
        for name in list(self.procs):
            await self.stop(name)


@pytest.fixture
async def roles(env: Env) -> AsyncIterator[Roles]:
    running = Roles(env)
    try:
        yield running
    finally:
        await running.stop_all()


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    """Status and body of a GET (connection errors count as status 0)."""
    try:
        async with session.get(url) as resp:
            return resp.status, await resp.text()
    except (aiohttp.ClientError, OSError):
        return 0, ""


async def wait_ready(
    session: aiohttp.ClientSession, port: int, proc: subprocess.Popen[bytes], what: str
) -> None:
    """Until ``/readyz`` on ``port`` answers 200 (fails at once if the process died)."""

    async def ready() -> bool:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        status, _ = await get(session, f"http://127.0.0.1:{port}/readyz")
        return status == 200

    await eventually(ready, timeout=30, what=f"{what} ready")


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the series ``name`` whose labels include ``labels`` (0 when none)."""
    return float(
        sum(
            s.value
            for s in samples(text, name)
            if all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


def samples(text: str, name: str) -> list[Any]:
    """Every sample called ``name`` in an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
