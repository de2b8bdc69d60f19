"""The aiohttp adapter: ``POST /handle``, ``GET /healthz``, ``GET /readyz``.

Only translation lives here: the signature (:mod:`shared.sdk.auth`, 401) and then
:meth:`Handler.handle`, whose :class:`Outcome` becomes the response.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from shared.domain.signing import DEFAULT_TOLERANCE

from .auth import authenticate, require_secrets
from .handler import Handler
from .outcomes import Outcome

#: Statuses whose responses must not carry a body (RFC 9110).
_BODILESS = frozenset({204, 205, 304})


def response(outcome: Outcome) -> web.Response:
    """``outcome`` as an aiohttp response (JSON body)."""
    if outcome.body is None or outcome.status in _BODILESS:
        return web.Response(status=outcome.status, headers=dict(outcome.headers))
    return web.json_response(outcome.body, status=outcome.status, headers=dict(outcome.headers))


class _Views:
    def __init__(
        self, handler: Handler, secrets: Mapping[str, bytes], tolerance: float, install: bool
    ) -> None:
        self.handler, self.secrets, self.tolerance = handler, secrets, tolerance
        self.install = install
        self.refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.secrets:
            refusal = authenticate(self.secrets, request.headers, body, tolerance=self.tolerance)
            if refusal is not None:
                # 401: the caller's configuration is wrong (or it is not who it says);
                # the consumer alerts and holds the message instead of dead-lettering it.
                self.refused += 1
                return response(refusal)
        return response(await self.handler.handle(body, request.headers))

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "handler": self.handler.name})

    async def readyz(self, _: web.Request) -> web.Response:
        ready = await self.handler.ready() and (self.handler.installed or not self.install)
        return web.json_response(
            {"ready": ready, "handler": self.handler.name}, status=200 if ready else 503
        )

    async def on_startup(self, _: web.Application) -> None:
        if self.install:
            await self.handler.install()


def aiohttp_app(
    handler: Handler,
    *,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    allow_unsigned: bool = False,
    install: bool = True,
) -> web.Application:
    """An aiohttp application serving ``handler`` under the handler contract.

    Every ``POST /handle`` must carry a valid signature by one of ``secrets`` (durable →
    secret) or is refused with 401; without secrets the app refuses to be built unless
    ``allow_unsigned``. With ``install``, the claim table and the handler's tables are
    created on startup (otherwise migrate :data:`shared.sdk.store.CLAIMS_DDL` yourself).
    """
    require_secrets(secrets, allow_unsigned=allow_unsigned)
    views = _Views(handler, secrets or {}, tolerance, install)
    app = web.Application()
    app.router.add_post("/handle", views.handle)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_get("/readyz", views.readyz)
    app.on_startup.append(views.on_startup)
    return app
