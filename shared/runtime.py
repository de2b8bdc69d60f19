"""What every role's process needs around its behaviour: logs, health, signals.

Logs are one JSON object per line (time, level, role, logger, message, and any
``extra`` fields such as durable or message_id, plus trace_id/span_id and the fields of
:func:`shared.telemetry.log_fields`). Health is served by a tiny aiohttp app:
``/healthz`` answers while the event loop runs; ``/readyz`` answers 200 only when every
readiness check passes, else 503 with the failing checks named; ``/metrics`` serves the
role's Prometheus registry (:mod:`shared.metrics`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from shared.telemetry import log_context

if TYPE_CHECKING:
    from shared.metrics import RoleMetrics

#: Exit codes, named (dramatiq's habit): supervisord and Kubernetes show them.
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_CONNECT = 3
EXIT_DRAIN_TIMEOUT = 4

_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "role": self.role,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(log_context())
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(role: str, level: str = "INFO") -> None:
    """JSON lines on stderr for ``role``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


#: A readiness check: a plain or an async callable returning True when ready.
ReadinessCheck = Callable[[], bool | Awaitable[bool]]
#: Longest wait for one async readiness check (a probe of PostgreSQL).
CHECK_TIMEOUT = 2.0


async def run_checks(checks: dict[str, ReadinessCheck]) -> dict[str, bool]:
    """Every check's verdict; an async one that errs or outlasts CHECK_TIMEOUT is False."""
    results: dict[str, bool] = {}
    for name, check in checks.items():
        try:
            outcome = check()
            if inspect.isawaitable(outcome):
                outcome = await asyncio.wait_for(outcome, timeout=CHECK_TIMEOUT)
            results[name] = bool(outcome)
        except Exception:  # a failing probe means "not ready", never a 500
            results[name] = False
    return results


def postgres_probe(pool: Any) -> Callable[[], Awaitable[bool]]:
    """A readiness check that a pooled connection answers ``SELECT 1``."""

    async def probe() -> bool:
        async with pool.acquire(timeout=CHECK_TIMEOUT) as conn:
            return bool(await conn.fetchval("SELECT 1") == 1)

    return probe


def postgres_probes(pools: Any) -> Callable[[], Awaitable[bool]]:
    """Readiness of every pool in the mapping ``pools`` (dlq roles: one per database)."""

    async def probe() -> bool:
        for pool in pools.values():
            if not await postgres_probe(pool)():
                return False
        return True

    return probe


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        checks: dict[str, ReadinessCheck],
        metrics: RoleMetrics | None = None,
    ) -> None:
        self._host, self._port, self.checks, self.metrics = host, port, checks, metrics
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        if metrics is not None:
            metrics.watch_readiness(self.checks)

    async def start(self) -> None:
        """Start serving."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if self.metrics is not None:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        results = await run_checks(self.checks)
        failing = [name for name, ok in results.items() if not ok]
        status = 503 if failing else 200
        return web.json_response({"ready": not failing, "failing": failing}, status=status)

    async def _metrics(self, _: web.Request) -> web.Response:
        assert self.metrics is not None
        body, content_type = await self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (the drain then runs under its deadline)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
