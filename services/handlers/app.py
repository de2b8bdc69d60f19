"""The HTTP face of a handler service: ``POST /handle``, ``GET /healthz``, ``GET /readyz``.

Only translation lives here; every decision is :meth:`HandlerService.handle`'s. The
application installs the service's tables on startup, so it is ready to serve as soon
as the runner is set up.
"""

from __future__ import annotations

from aiohttp import web

from .service import HandlerService, Outcome

#: Statuses whose responses must not carry a body (RFC 9110).
_BODILESS = frozenset({204, 205, 304})


def _response(outcome: Outcome) -> web.Response:
    if outcome.body is None or outcome.status in _BODILESS:
        return web.Response(status=outcome.status, headers=dict(outcome.headers))
    return web.json_response(outcome.body, status=outcome.status, headers=dict(outcome.headers))


class _Views:
    def __init__(self, service: HandlerService) -> None:
        self.service = service

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
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


def make_app(*, service: HandlerService) -> web.Application:
    """An aiohttp application serving ``service`` under the handler contract."""
    views = _Views(service)
    app = web.Application()
    app.router.add_post("/handle", views.handle)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_get("/readyz", views.readyz)
    app.on_startup.append(views.on_startup)
    return app
