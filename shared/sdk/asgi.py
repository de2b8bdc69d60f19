"""The ASGI adapter (Starlette, hence FastAPI): install with the ``sdk`` extra.

:func:`asgi_app` is a complete Starlette application (``POST /handle``, ``GET /healthz``,
``GET /readyz``); :func:`handle_endpoint` is the one endpoint, for an application of
your own::

    app = FastAPI(lifespan=...)
    app.add_api_route("/handle", handle_endpoint(handler, secrets=load_secrets()),
                      methods=["POST"])

Either way the signature is checked first (401), then :meth:`Handler.handle` answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.adapters.postgres import create_default_pool
from shared.domain.signing import DEFAULT_TOLERANCE

from .auth import authenticate, require_secrets
from .handler import Handler
from .outcomes import Outcome

#: Statuses whose responses must not carry a body (RFC 9110).
_BODILESS = frozenset({204, 205, 304})

Endpoint = Callable[[Request], Awaitable[Response]]


def response(outcome: Outcome) -> Response:
    """``outcome`` as a Starlette response (JSON body)."""
    if outcome.body is None or outcome.status in _BODILESS:
        return Response(status_code=outcome.status, headers=dict(outcome.headers))
    return JSONResponse(outcome.body, status_code=outcome.status, headers=dict(outcome.headers))


def handle_endpoint(
    handler: Handler,
    *,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    allow_unsigned: bool = False,
) -> Endpoint:
    """The ``POST /handle`` endpoint: signature (401), then the handler's answer."""
    require_secrets(secrets, allow_unsigned=allow_unsigned)
    known = dict(secrets or {})

    async def handle(request: Request) -> Response:
        body = await request.body()
        if known:
            refusal = authenticate(known, request.headers, body, tolerance=tolerance)
            if refusal is not None:
                return response(refusal)
        return response(await handler.handle(body, request.headers))

    return handle


def asgi_app(
    handler: Handler,
    *,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    allow_unsigned: bool = False,
    dsn: str | None = None,
    install: bool = True,
) -> Starlette:
    """A Starlette application serving ``handler``.

    With ``dsn``, its lifespan opens an asyncpg pool and binds it (closed at shutdown);
    otherwise bind one yourself before the first call. With ``install``, the claim table
    and the handler's tables are created at startup.
    """
    endpoint = handle_endpoint(
        handler, secrets=secrets, tolerance=tolerance, allow_unsigned=allow_unsigned
    )

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok", "handler": handler.name})

    async def readyz(_: Request) -> Response:
        ready = await handler.ready() and (handler.installed or not install)
        return JSONResponse(
            {"ready": ready, "handler": handler.name}, status_code=200 if ready else 503
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        pool = None
        if dsn is not None:
            pool = await create_default_pool(dsn, min_size=1, max_size=10)
            handler.bind(pool)
        try:
            if install:
                await handler.install()
            yield
        finally:
            if pool is not None:
                await pool.close()

    return Starlette(
        routes=[
            Route("/handle", endpoint, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
