"""The console's web application: routes, sign-in, CSRF, health, rendering, the overview.

Reading needs a signed-in user (read-only or operator); every POST that changes something
needs an operator and the session's CSRF token, and goes through the use-cases the ``ferry``
CLI runs (:mod:`shared.ops.dlq`, :mod:`shared.ops.parked`, :mod:`shared.ops.where`).
Errors are shown in the page in words; a stack trace only reaches the log.

The pages live beside it: :mod:`.failures` (dead letters, actions, bulk replay jobs),
:mod:`.events` (event search, an event's journey, the KPI report), :mod:`.replay_api`
(the JSON API); :mod:`.views` holds what they share.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from prometheus_client import Counter, Histogram

from shared.adapters.nats import NatsClient
from shared.adapters.postgres import DATABASE_ERRORS, Pool
from shared.contracts.topology import Topology
from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.runtime.metrics import RoleMetrics
from shared.waits import sleep_unless

from . import views
from .auth import Authenticator, Session, cookie_name
from .durables import DurablePages
from .events import EventPages
from .failures import FailurePages
from .jobs import Jobs
from .overview import THRESHOLDS, Overview, read_overview
from .replay_api import ReplayApi
from .settings import ConsoleSettings
from .views import Samples, UserError, capped_message, field, safe_next

log = logging.getLogger("ferry.console")
#: A server the console reads could not answer: a page in words (503), not a 500. asyncpg's
#: InterfaceError (a connection dropped or its pool closing) is not a PostgresError.
SERVER_ERRORS: tuple[type[BaseException], ...] = (TransientError, *DATABASE_ERRORS)
HERE = Path(__file__).resolve().parent
#: Paths of the JSON API: errors as JSON, 401 instead of the sign-in page.
API = "/api/"
#: Paths served without signing in.
PUBLIC = ("/login", "/healthz", "/readyz", "/metrics", "/static/")
#: Paths served while the console starts or stops (its connections not all open).
ALWAYS = ("/healthz", "/readyz", "/metrics", "/static/")
_SESSION_KEY = web.RequestKey("session", Session)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Console:
    """One topology's console: connections, sign-in, jobs, samples and the web app."""

    def __init__(
        self,
        settings: ConsoleSettings,
        topology: Topology,
        pools: dict[str, Pool],
        nats: Callable[[], NatsClient | None],
        auth: Authenticator,
        metrics: RoleMetrics,
    ) -> None:
        self.settings, self.topology, self.pools, self.auth = settings, topology, pools, auth
        self._nats = nats
        #: The session cookie's name, this console's own (see ``console_cookie_name``).
        self.cookie = settings.console_cookie_name or cookie_name(
            topology.name, settings.console_port
        )
        #: A one-time message to the next page (e.g. "replayed on …"), read once.
        self.note_cookie = f"{self.cookie}_note"
        self.jobs = Jobs()
        self.samples = Samples(settings.console_sample_interval)
        self.metrics = metrics
        self.actions = Counter(
            "ferry_console_actions_total",
            "Operator actions taken in the console, by action and outcome.",
            ["action", "outcome"],
            registry=metrics.registry,
        )
        self.render_seconds = Histogram(
            "ferry_console_render_seconds",
            "Seconds to build a console page, by page.",
            ["page"],
            registry=metrics.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(views.filters())
        #: Set once every pool is open and NATS connected; cleared first when stopping.
        #: Until then every page but health answers 503 (``pools`` is still being filled).
        self.ready = False
        self.stopping = False

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(
            middlewares=[self._errors, self._security_headers, self._not_ready, self._signed_in],
            client_max_size=64 * 1024,
        )
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_page)
        r.add_static("/static/", HERE / "static", show_index=False, follow_symlinks=False)
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/", self.overview)
        FailurePages(self).add_routes(r)
        EventPages(self).add_routes(r)
        DurablePages(self).add_routes(r)
        ReplayApi(self).add_routes(r)
        return app

    @property
    def nc(self) -> NatsClient | None:
        """The console's NATS connection (None before it connected)."""
        return self._nats()

    # ------------------------------------------------------------------ middlewares

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Bad input and refusals as a page in words; anything else logged, never shown."""
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except UserError as exc:
            return self.error_page(request, str(exc), exc.status)
        except (ValueError, ConfigurationError) as exc:
            if isinstance(exc, AccessDenied):
                log.error("access refused: %s", exc)
                return self.error_page(request, "the console's own login was refused", 503)
            return self.error_page(request, str(exc), 400)
        except SERVER_ERRORS as exc:
            ref = secrets.token_hex(4)
            log.warning("request %s %s failed (ref %s): %s", request.method, request.path, ref,
                        exc)  # fmt: skip
            return self.error_page(
                request,
                f"a server the console reads could not answer ({type(exc).__name__}); "
                f"try again (reference {ref} in the console's log)",
                503,
            )
        except Exception:
            ref = secrets.token_hex(4)
            log.exception("request %s %s failed (ref %s)", request.method, request.path, ref)
            return self.error_page(
                request, f"internal error (reference {ref} in the console's log)", 500
            )

    @web.middleware
    async def _security_headers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Frame-Options", "DENY")
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @web.middleware
    async def _not_ready(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """While starting or stopping, a page in words (503, with Retry-After), not a 500
        from a connection that is not there yet (or any more)."""
        if self.ready or request.path.startswith(ALWAYS):
            return await handler(request)
        state = self._state()
        response = self.error_page(
            request, f"the console is {state}: try again in a few seconds", 503
        )
        response.headers["Retry-After"] = "2"
        return response

    def _state(self) -> str:
        return "stopping" if self.stopping else "starting"

    @web.middleware
    async def _signed_in(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(PUBLIC):
            return await handler(request)
        session = self.auth.from_bearer(request.headers.get("Authorization"))
        if session is None:
            session = self.auth.from_cookie(request.cookies.get(self.cookie))
        if session is None:
            if request.path.startswith(API):
                return web.json_response(
                    {"error": "sign in first: Authorization: Bearer <token>, or a session"},
                    status=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if request.method == "GET":
                raise web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
            raise web.HTTPUnauthorized(text="sign in first")
        request[_SESSION_KEY] = session
        if request.method == "POST":
            # A form carries the token in a field; a JSON call (the API) in a header.
            token = request.headers.get("X-CSRF-Token")
            if token is None and not request.path.startswith(API):
                token = field(await request.post(), "csrf")
            if not self.auth.check_csrf(session, token):
                return self.error_page(
                    request,
                    "the form is out of date or came from another site (CSRF check failed): "
                    "reload the page and try again",
                    403,
                )
        return await handler(request)

    # ------------------------------------------------------------------ rendering

    def render(
        self, request: web.Request, template: str, status: int = 200, **context: Any
    ) -> web.Response:
        session = request.get(_SESSION_KEY)
        sealed = request.cookies.get(self.note_cookie)
        page = self.templates.get_template(template).render(
            session=session,
            note=self.auth.unseal(sealed),
            csrf=self.auth.csrf_token(session) if session is not None else "",
            topology=self.topology.name,
            path=request.path,
            **context,
        )
        response = web.Response(text=page, content_type="text/html", status=status)
        if sealed is not None:  # shown once: forgotten
            response.del_cookie(self.note_cookie, path=request.rel_url.raw_path)
        return response

    def error_page(self, request: web.Request, message: str, status: int) -> web.Response:
        # A message may repeat the input: a 5,000-character one is not shown in full.
        message = capped_message(message)
        if request.path.startswith(API):
            return web.json_response({"error": message}, status=status)
        return self.render(request, "error.html", status=status, message=message)

    def session_of(self, request: web.Request) -> Session:
        """Who signed the request in."""
        return request[_SESSION_KEY]

    def leave_note(self, response: web.StreamResponse, text: str, path: str) -> None:
        """A one-time message for the page at ``path`` (a short-lived signed cookie of
        that path, read and forgotten by :meth:`render`): a reload does not show it
        again, as a query parameter would."""
        response.set_cookie(
            self.note_cookie,
            self.auth.seal(text[:500]),
            max_age=60,
            httponly=True,
            samesite="Strict",
            secure=self.settings.secure_cookie,
            path=path,
        )

    def log_action(self, text: str, actor: str) -> None:
        """Log an operator action with its actor."""
        log.info("%s", text, extra={"actor": actor})

    def operator(self, request: web.Request) -> Session:
        """The signed-in operator, or a refusal (403) for a read-only user."""
        session = request[_SESSION_KEY]
        if not session.may_act:
            self.actions.labels("any", "forbidden").inc()
            raise UserError(
                f"{session.user} is read-only: only an operator may replay, edit, park, "
                "discard, pause or resume",
                403,
            )
        return session

    # ------------------------------------------------------------------ health

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        if not self.ready:
            # Start-up is still opening (and adding) pools; stopping is closing them.
            failing = [self._state()]
            return web.json_response({"ready": False, "failing": failing}, status=503)
        failing = []
        if self.nc is None or not self.nc.is_connected:
            failing.append("nats")
        for name, pool in list(self.pools.items()):
            try:
                async with pool.acquire(timeout=2) as conn:
                    await conn.fetchval("SELECT 1")
            except DATABASE_ERRORS:  # a dropped connection is an InterfaceError, not 500
                failing.append(f"postgres:{name}")
        return web.json_response(
            {"ready": not failing, "failing": failing}, status=503 if failing else 200
        )

    async def metrics_page(self, _: web.Request) -> web.Response:
        body, content_type = await self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    # ------------------------------------------------------------------ sign-in

    async def login_form(self, request: web.Request) -> web.Response:
        return self.render(
            request,
            "login.html",
            next=safe_next(request.query.get("next")),
            failed=False,
            configured=self.auth.configured,
        )

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        user, password = field(form, "user") or "", field(form, "password") or ""
        target = safe_next(field(form, "next"))
        session = self.auth.sign_in(user, password)
        if session is None:
            log.info("sign-in refused", extra={"user": user[:64]})
            return self.render(
                request,
                "login.html",
                status=401,
                next=target,
                failed=True,
                locked=self.auth.locked(user),
                configured=self.auth.configured,
            )
        log.info("signed in", extra={"user": user, "role": session.role})
        response = web.HTTPSeeOther(target)
        response.set_cookie(
            self.cookie,
            self.auth.cookie(session),
            max_age=int(self.auth.ttl),
            httponly=True,
            samesite="Strict",
            secure=self.settings.secure_cookie,
            path="/",
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        response = web.HTTPSeeOther("/login")
        response.del_cookie(self.cookie, path="/")
        raise response

    # ------------------------------------------------------------------ overview

    async def read_overview(self) -> Overview:
        """The overview's figures now (also recorded as a sample)."""
        overview = await read_overview(
            self.topology,
            self.pools,
            self.nc,
            self.settings.console_role_health,
            self.settings.console_role_health_timeout,
        )
        self.samples.add(overview)
        return overview

    async def sample_forever(self, stop: asyncio.Event) -> None:
        """Record the overview's figures every ``console_sample_interval`` seconds."""
        while not stop.is_set():
            try:
                await self.read_overview()
            except Exception:  # a failed sample is a gap in the sparkline, nothing more
                log.warning("overview sample failed", exc_info=True)
            await sleep_unless(stop, self.samples.interval)

    async def overview(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        overview = await self.read_overview()
        live = request.query.get("live") == "1"
        response = self.render(
            request,
            "overview.html",
            overview=overview,
            samples=self.samples,
            thresholds=THRESHOLDS,
            live=live,
            refresh=int(self.samples.interval),
        )
        elapsed = time.perf_counter() - started
        self.render_seconds.labels("overview").observe(elapsed)
        response.headers["Server-Timing"] = f"overview;dur={elapsed * 1000:.1f}"
        return response
