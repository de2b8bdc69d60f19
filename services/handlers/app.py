"""The HTTP face of an example handler service: the SDK's aiohttp adapter
(:func:`shared.sdk.aiohttp_app.aiohttp_app`: ``POST /handle``, ``GET /healthz``,
``GET /readyz``) with Ferry's spans, ``/metrics`` and the out-of-order counter added.

The application installs the service's tables on startup, so it is ready to serve as soon
as the runner is set up; or, with ``install=False`` (``python -m services.handlers``), it
listens at once and answers 503 "starting" until the role has bound a pool and installed
the tables (:meth:`HandlerService.install`), as every role's readiness does.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from shared.domain.signing import DEFAULT_TOLERANCE
from shared.runtime.metrics import counter_family
from shared.sdk.aiohttp_app import aiohttp_app

from .metrics import observe_app
from .ordering import reported
from .service import HandlerService


def make_app(
    *,
    service: HandlerService,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    install: bool = True,
) -> web.Application:
    """An aiohttp application serving ``service`` under the handler contract.

    With ``secrets`` (durable → secret), every ``POST /handle`` must carry a valid
    signature (:mod:`shared.domain.signing`) or it is refused with 401; without, calls
    are not authenticated (``python -m services.handlers`` warns at start). With
    ``install`` the tables are installed on startup (the service has its pool); without,
    every path but ``/healthz`` and ``/metrics`` answers 503 until they are.
    """
    app = aiohttp_app(
        service, secrets=secrets, tolerance=tolerance, allow_unsigned=True, install=install
    )
    if not install:
        app.middlewares.append(_starting(service))
    metrics = observe_app(app, role=f"handler-{service.name}")  # spans, /metrics
    metrics.add_collector(
        lambda: [
            counter_family(
                "ferry_handler_out_of_order",
                "Events applied although their revision was below the one they replaced "
                "(per-key order broken upstream).",
                ["handler", "event_type"],
                reported(service.name),
            )
        ]
    )
    return app


#: Paths that answer while the service is starting.
ALWAYS = frozenset({"/healthz", "/metrics"})


def _starting(service: HandlerService) -> Middleware:
    """503 "starting" (with Retry-After) until the service's tables are installed: a call
    then is retried by the consumer, a readiness probe fails, nothing touches the pool."""

    @web.middleware
    async def starting(request: web.Request, handler: Handler) -> web.StreamResponse:
        if service.installed or request.path in ALWAYS:
            return await handler(request)
        return web.json_response(
            {"ready": False, "handler": service.name, "failing": ["starting"], "retryable": True},
            status=503,
            headers={"Retry-After": "1"},
        )

    return starting
