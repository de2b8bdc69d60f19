"""What every role's process needs around its behaviour: logs, health, signals.

Logs are one JSON object per line (time, level, role, logger, message, and any
``extra`` fields such as durable or message_id). Health is served by a tiny aiohttp
app: ``/healthz`` answers while the event loop runs; ``/readyz`` answers 200 only
when every readiness check passes, else 503 with the failing checks named.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

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


ReadinessCheck = Callable[[], bool]


class HealthServer:
    """``/healthz`` and ``/readyz`` on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, *, host: str, port: int, checks: dict[str, ReadinessCheck]) -> None:
        self._host, self._port, self.checks = host, port, checks
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def start(self) -> None:
        """Start serving."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
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
        failing = [name for name, check in self.checks.items() if not check()]
        status = 503 if failing else 200
        return web.json_response({"ready": not failing, "failing": failing}, status=status)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT (the drain then runs under its deadline)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
