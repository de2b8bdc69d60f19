"""A handler service's instruments and its aiohttp middleware (spans, ``/metrics``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from prometheus_client import Histogram

from shared import telemetry
from shared.runtime.metrics import OPERATION_BUCKETS, RoleMetrics


def observe_app(app: web.Application, *, role: str) -> RoleMetrics:
    """Trace and time every request of an aiohttp ``app`` and serve its ``/metrics``.

    Each request gets a SERVER span continuing the caller's traceparent (the consumer's
    handler call), log lines carrying its message id, and a duration sample.
    """
    metrics = RoleMetrics(role)
    http = HttpServerMetrics(metrics)

    @web.middleware
    async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/metrics":
            return await handler(request)  # type: ignore[no-any-return]
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else request.path
        )
        message_id = request.headers.get("Idempotency-Key")
        clock = asyncio.get_running_loop()
        started, status = clock.time(), 500
        with (
            telemetry.server_span(request.method, route, request.headers, message_id) as span,
            telemetry.log_fields(message_id=message_id),
        ):
            try:
                response: web.StreamResponse = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                http.observe(request.method, route, status, clock.time() - started)
                if span is not None:
                    span.set_attribute("http.response.status_code", status)

    async def serve_metrics(_: web.Request) -> web.Response:
        body, content_type = await metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.middlewares.append(observe)
    app.router.add_get("/metrics", serve_metrics)
    return metrics


class HttpServerMetrics:
    """A handler service: request duration by method and status (HTTP semantic conventions)."""

    def __init__(self, role: RoleMetrics) -> None:
        self._duration = Histogram(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests.",
            ["http_request_method", "http_route", "http_response_status_code"],
            buckets=OPERATION_BUCKETS,
            registry=role.registry,
        )
        # The labelled children by (method, route, status): ``labels()`` per request costs
        # more than the observation. Bounded, as a path no route matches is its own label.
        self._children: dict[tuple[str, str, int], Any] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request served."""
        key = (method, route, status)
        child = self._children.get(key)
        if child is None:
            child = self._duration.labels(method, route, str(status))
            if len(self._children) < _MAX_CHILDREN:
                self._children[key] = child
        child.observe(seconds)


#: Label combinations whose child :class:`HttpServerMetrics` keeps at hand.
_MAX_CHILDREN = 256
