"""The HTTP face of a handler service: ``POST /handle``, ``GET /healthz``, ``GET /readyz``.

Only translation lives here; every decision is :meth:`HandlerService.handle`'s. The
application installs the service's tables on startup, so it is ready to serve as soon
as the runner is set up.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from aiohttp import web

from shared.domain.signing import DEFAULT_TOLERANCE, SignatureError, verify
from shared.runtime.metrics import counter_family

from .metrics import observe_app
from .ordering import reported
from .service import HandlerService, Outcome

#: Statuses whose responses must not carry a body (RFC 9110).
_BODILESS = frozenset({204, 205, 304})


def _response(outcome: Outcome) -> web.Response:
    if outcome.body is None or outcome.status in _BODILESS:
        return web.Response(status=outcome.status, headers=dict(outcome.headers))
    return web.json_response(outcome.body, status=outcome.status, headers=dict(outcome.headers))


class _Views:
    def __init__(
        self, service: HandlerService, secrets: Mapping[str, bytes], tolerance: float
    ) -> None:
        self.service, self.secrets, self.tolerance = service, secrets, tolerance
        self.refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.secrets:
            try:
                verify(
                    self.secrets, request.headers, body, now=time.time(), tolerance=self.tolerance
                )
            except SignatureError as exc:
                # 401: the caller's configuration is wrong (or it is not who it says);
                # the consumer alerts and holds the message instead of dead-lettering it.
                self.refused += 1
                return web.json_response(
                    {
                        "error": "unauthenticated",
                        "reason_code": "BAD_SIGNATURE",
                        "detail": str(exc),
                    },
                    status=401,
                    headers={"WWW-Authenticate": 'Ferry-HMAC realm="handle"'},
                )
        outcome = await self.service.handle(body, request.headers)
        return _response(outcome)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "handler": self.service.name})

    async def readyz(self, _: web.Request) -> web.Response:
        ready = await self.service.ready()
        return web.json_response(
            {"ready": ready, "handler": self.service.name}, status=200 if ready else 503
        )

    async def on_startup(self, _: web.Application) -> None:
        await self.service.install()


def make_app(
    *,
    service: HandlerService,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> web.Application:
    """An aiohttp application serving ``service`` under the handler contract.

    With ``secrets`` (durable → secret), every ``POST /handle`` must carry a valid
    signature (:mod:`shared.domain.signing`) or it is refused with 401.
    """
    views = _Views(service, secrets or {}, tolerance)
    app = web.Application()
    app.router.add_post("/handle", views.handle)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_get("/readyz", views.readyz)
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
    app.on_startup.append(views.on_startup)
    return app
