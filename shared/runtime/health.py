"""The health and metrics endpoint every role serves.

A tiny aiohttp app: ``/healthz`` answers while the event loop runs; ``/readyz`` answers
200 only when every readiness check (:mod:`shared.runtime.readiness`) passes, else 503
with the failing checks named (and, in ``hops``, why a hop to a server or the handler
fails: :mod:`shared.telemetry.hops`); ``/metrics`` serves the role's Prometheus registry
(:mod:`shared.runtime.metrics`).
"""

from __future__ import annotations

from aiohttp import web

from shared.runtime.metrics import RoleMetrics
from shared.runtime.readiness import ReadinessCheck, run_checks
from shared.telemetry import hops


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
        doc = {"ready": not failing, "failing": failing, "hops": hops.failing()}
        return web.json_response(doc, status=status)

    async def _metrics(self, _: web.Request) -> web.Response:
        assert self.metrics is not None
        body, content_type = await self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})
