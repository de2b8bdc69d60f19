"""The console's web application: routes, sign-in, CSRF, the pages and the actions.

Reading needs a signed-in user (read-only or operator); every POST that changes something
needs an operator and the session's CSRF token, and goes through the ``ferry`` CLI's own
functions (:mod:`shared.ops.dlq`, :mod:`shared.ops.parked`, :mod:`shared.ops.where`).
Errors are shown in the page in words; a stack trace only reaches the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
import jinja2
from aiohttp import web
from nats.aio.client import Client as NATS
from prometheus_client import Counter, Histogram

from shared.adapters import dead_letters as store
from shared.adapters.postgres import DATABASE_ERRORS
from shared.contracts.topology import Topology
from shared.domain.errors import AccessDenied, ConfigurationError, TransientError
from shared.ops import dlq as dlq_ops
from shared.ops import parked as parked_ops
from shared.ops import where as where_ops
from shared.runtime.metrics import RoleMetrics

from . import data
from .auth import COOKIE, Authenticator, Session
from .jobs import Job, Jobs, new_message_id
from .replay_api import ReplayApi
from .settings import ConsoleSettings
from .svg import sparkline

log = logging.getLogger("ferry.console")
#: A server the console reads could not answer: a page in words (503), not a 500. asyncpg's
#: InterfaceError (a connection dropped or its pool closing) is not a PostgresError.
SERVER_ERRORS: tuple[type[BaseException], ...] = (TransientError, *DATABASE_ERRORS)
HERE = Path(__file__).resolve().parent
#: The sparklines' span (seconds).
HOUR = 3600.0
#: Most entries one action (a group) may take at once.
MAX_ENTRIES = 10_000
#: Most entries a group page lists.
GROUP_PAGE = 500
#: Paths of the JSON API: errors as JSON, 401 instead of the sign-in page.
API = "/api/"
#: Paths served without signing in.
PUBLIC = ("/login", "/healthz", "/readyz", "/metrics", "/static/")
_SESSION_KEY = web.RequestKey("session", Session)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UserError(Exception):
    """Bad input or a refused action: shown to the user as is, with an HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Samples:
    """The overview's figures over the last hour, in memory (for the sparklines)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.series: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self.last = 0.0

    def add(self, overview: data.Overview) -> None:
        """Record one overview's figures (at most one sample per half interval)."""
        now = time.time()
        if now - self.last < self.interval / 2:
            return
        self.last = now
        keep = int(HOUR / self.interval) + 2
        for ctx in overview.contexts:
            self._put(("outbox_backlog", ctx.name), now, ctx.backlog, keep)
            self._put(("outbox_oldest_age", ctx.name), now, ctx.oldest_age or 0.0, keep)
        for view in overview.durables:
            if view.lag_messages is not None:
                self._put(("lag_messages", view.name), now, view.lag_messages, keep)
                self._put(("lag_seconds", view.name), now, view.lag_seconds or 0.0, keep)
            self._put(("rate", view.name), now, view.rate, keep)
            if view.success_ratio is not None:
                self._put(("success_ratio", view.name), now, view.success_ratio, keep)
            self._put(("dead_open", view.name), now, view.dead_open, keep)

    def _put(self, key: tuple[str, str], at: float, value: float, keep: int) -> None:
        series = self.series.setdefault(key, deque(maxlen=keep))
        series.append((at, float(value)))

    def svg(self, kind: str, name: str, label: str, floor_top: float = 1.0) -> str:
        """The sparkline of one series, with its alert threshold: the last hour, or since
        the first sample when the console has run for less."""
        points = list(self.series.get((kind, name), ()))
        now = time.time()
        since = points[0][0] if points else now - HOUR
        return sparkline(
            points,
            span=max(min(HOUR, now - since), 2 * self.interval),
            now=now,
            threshold=data.THRESHOLDS.get(kind),
            floor_top=floor_top,
            label=label,
        )


class Console:
    """One topology's console: connections, sign-in, jobs, samples and the web app."""

    def __init__(
        self,
        settings: ConsoleSettings,
        topology: Topology,
        pools: dict[str, asyncpg.Pool],
        nats: Callable[[], NATS | None],
        auth: Authenticator,
        metrics: RoleMetrics,
    ) -> None:
        self.settings, self.topology, self.pools, self.auth = settings, topology, pools, auth
        self._nats = nats
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
        self.templates.filters["when"] = _when
        self.templates.filters["age"] = _age
        self.templates.filters["num"] = _num
        self.templates.filters["pct"] = _pct
        self.templates.filters["short"] = _short
        self.templates.filters["q"] = lambda value: quote(str(value), safe="")
        self.ready = False

    # ------------------------------------------------------------------ app

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(
            middlewares=[self._errors, self._security_headers, self._signed_in],
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
        r.add_get("/failures", self.failures)
        r.add_get("/failures/group", self.group)
        r.add_get("/failures/entry/{durable}/{message_id}", self.entry)
        r.add_post("/failures/action", self.action)
        r.add_get("/jobs", self.job_list)
        r.add_get("/jobs/{job_id}", self.job)
        r.add_post("/jobs/{job_id}/cancel", self.cancel_job)
        r.add_post("/parked/discard", self.discard_parked)
        r.add_get("/event", self.event_search)
        r.add_get("/event/{message_id}", self.event)
        r.add_get("/kpi", self.kpi)
        r.add_get("/kpi/file/{run}/{name}", self.kpi_file)
        ReplayApi(self).add_routes(r)
        return app

    @property
    def nc(self) -> NATS | None:
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
            return self._error_page(request, str(exc), exc.status)
        except (ValueError, ConfigurationError) as exc:
            if isinstance(exc, AccessDenied):
                log.error("access refused: %s", exc)
                return self._error_page(request, "the console's own login was refused", 503)
            return self._error_page(request, str(exc), 400)
        except SERVER_ERRORS as exc:
            ref = secrets.token_hex(4)
            log.warning("request %s %s failed (ref %s): %s", request.method, request.path, ref,
                        exc)  # fmt: skip
            return self._error_page(
                request,
                f"a server the console reads could not answer ({type(exc).__name__}); "
                f"try again (reference {ref} in the console's log)",
                503,
            )
        except Exception:
            ref = secrets.token_hex(4)
            log.exception("request %s %s failed (ref %s)", request.method, request.path, ref)
            return self._error_page(
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
    async def _signed_in(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(PUBLIC):
            return await handler(request)
        session = self.auth.from_bearer(request.headers.get("Authorization"))
        if session is None:
            session = self.auth.from_cookie(request.cookies.get(COOKIE))
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
                token = _field(await request.post(), "csrf")
            if not self.auth.check_csrf(session, token):
                return self._error_page(
                    request,
                    "the form is out of date or came from another site (CSRF check failed): "
                    "reload the page and try again",
                    403,
                )
        return await handler(request)

    # ------------------------------------------------------------------ rendering

    def _render(
        self, request: web.Request, template: str, status: int = 200, **context: Any
    ) -> web.Response:
        session = request.get(_SESSION_KEY)
        page = self.templates.get_template(template).render(
            session=session,
            csrf=self.auth.csrf_token(session) if session is not None else "",
            topology=self.topology.name,
            path=request.path,
            **context,
        )
        return web.Response(text=page, content_type="text/html", status=status)

    def _error_page(self, request: web.Request, message: str, status: int) -> web.Response:
        if request.path.startswith(API):
            return web.json_response({"error": message}, status=status)
        return self._render(request, "error.html", status=status, message=message)

    # What the replay API (:mod:`.replay_api`) uses of the console.
    render = _render
    error_page = _error_page

    def session_of(self, request: web.Request) -> Session:
        """Who signed the request in."""
        return request[_SESSION_KEY]

    def log_action(self, text: str, actor: str) -> None:
        """Log an operator action with its actor."""
        log.info("%s", text, extra={"actor": actor})

    def _operator(self, request: web.Request) -> Session:
        session = request[_SESSION_KEY]
        if not session.may_act:
            self.actions.labels("any", "forbidden").inc()
            raise UserError(
                f"{session.user} is read-only: only an operator may replay, park or discard",
                403,
            )
        return session

    # ------------------------------------------------------------------ health

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        failing = [] if self.ready else ["starting"]
        if self.nc is None or not self.nc.is_connected:
            failing.append("nats")
        for name, pool in self.pools.items():
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
        return self._render(
            request,
            "login.html",
            next=_safe_next(request.query.get("next")),
            failed=False,
            configured=self.auth.configured,
        )

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        user, password = _field(form, "user") or "", _field(form, "password") or ""
        target = _safe_next(_field(form, "next"))
        session = self.auth.sign_in(user, password)
        if session is None:
            log.info("sign-in refused", extra={"user": user[:64]})
            return self._render(
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
            COOKIE,
            self.auth.cookie(session),
            max_age=int(self.auth.ttl),
            httponly=True,
            samesite="Strict",
            secure=self.settings.console_secure_cookie,
            path="/",
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        response = web.HTTPSeeOther("/login")
        response.del_cookie(COOKIE, path="/")
        raise response

    # ------------------------------------------------------------------ overview

    async def read_overview(self) -> data.Overview:
        """The overview's figures now (also recorded as a sample)."""
        overview = await data.read_overview(self.topology, self.pools, self.nc)
        self.samples.add(overview)
        return overview

    async def sample_forever(self, stop: asyncio.Event) -> None:
        """Record the overview's figures every ``console_sample_interval`` seconds."""
        while not stop.is_set():
            try:
                await self.read_overview()
            except Exception:  # a failed sample is a gap in the sparkline, nothing more
                log.warning("overview sample failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.samples.interval)

    async def overview(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        overview = await self.read_overview()
        live = request.query.get("live") == "1"
        response = self._render(
            request,
            "overview.html",
            overview=overview,
            samples=self.samples,
            thresholds=data.THRESHOLDS,
            live=live,
            refresh=int(self.samples.interval),
        )
        elapsed = time.perf_counter() - started
        self.render_seconds.labels("overview").observe(elapsed)
        response.headers["Server-Timing"] = f"overview;dur={elapsed * 1000:.1f}"
        return response

    # ------------------------------------------------------------------ failures

    def _durable_param(self, value: str | None) -> str | None:
        if not value:
            return None
        if value not in self.topology.durables:
            raise UserError(
                f"no durable {value!r} in topology {self.topology.name} "
                f"(known: {', '.join(sorted(self.topology.durables))})"
            )
        return value

    async def failures(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        durable = self._durable_param(request.query.get("durable"))
        reason = request.query.get("reason") or None
        status = request.query.get("status", "open")
        groups = await data.failure_groups(
            self.topology,
            self.pools,
            durable=durable,
            reason=reason,
            statuses=data.statuses_for(status),
        )
        parked = []
        for name, spec in sorted(self.topology.durables.items()):
            if spec.ordering == "key" and durable in (None, name):
                rows, summary = await parked_ops.parked_keys(self.settings, name, None, 100)
                parked.append({"durable": name, "keys": rows, "summary": summary})
        self.render_seconds.labels("failures").observe(time.perf_counter() - started)
        return self._render(
            request,
            "failures.html",
            groups=groups,
            parked=parked,
            durables=sorted(self.topology.durables),
            filters={"durable": durable or "", "reason": reason or "", "status": status},
        )

    def _group_key(self, source: Any) -> data.GroupKey:
        durable = self._durable_param(_field(source, "durable"))
        reason, fingerprint = _field(source, "reason_code"), _field(source, "fp")
        if durable is None or not reason or not fingerprint:
            raise UserError("a group is named by durable, reason_code and fp")
        return data.GroupKey(durable, reason, fingerprint)

    async def group(self, request: web.Request) -> web.Response:
        key = self._group_key(request.query)
        status = request.query.get("status", "open")
        entries, counts = await data.group_entries(
            self.topology, self.pools, key, data.statuses_for(status), limit=GROUP_PAGE
        )
        if not entries:
            raise UserError(
                f"no {status} dead letters of {key.durable} with reason {key.reason} and "
                f"fingerprint {key.fingerprint} (replayed or discarded since?)",
                404,
            )
        return self._render(
            request,
            "group.html",
            key=key,
            entries=entries,
            counts=counts,
            total=sum(counts.values()),
            which=status,
            shown=GROUP_PAGE,
            default_rate=self.settings.console_replay_rate,
        )

    async def entry(self, request: web.Request) -> web.Response:
        durable = self._durable_param(request.match_info["durable"])
        assert durable is not None
        message_id = new_message_id(request.match_info["message_id"])
        row = await dlq_ops.show_dead_letter(self.settings, durable, message_id)
        if row is None:
            raise UserError(f"no dead letter {durable}/{message_id}", 404)
        record = row.pop("record")
        return self._render(
            request,
            "entry.html",
            row=row,
            record=record,
            payload=json.dumps(record.get("payload"), indent=2, default=str),
            history=record.get("retryHistory") or [],
            default_rate=self.settings.console_replay_rate,
            done=request.query.get("done"),
        )

    async def _targets(self, form: Any, scope: str) -> tuple[list[dict[str, Any]], str]:
        """The entries an action names (one entry, or a group's open ones) and a title."""
        if scope == "entry":
            durable = self._durable_param(_field(form, "durable"))
            message_id = new_message_id(_field(form, "message_id") or "")
            if durable is None:
                raise UserError("name the durable of the dead letter")
            rows = await dlq_ops.find_dead_letters(
                self.settings, store.Query(durables=[durable], message_ids=[message_id])
            )
            if not rows:
                raise UserError(f"no dead letter {durable}/{message_id}", 404)
            return rows, f"{durable}/{message_id}"
        if scope == "group":
            key = self._group_key(form)
            entries, _ = await data.group_entries(
                self.topology, self.pools, key, list(data.OPEN_STATUSES), limit=MAX_ENTRIES
            )
            return entries, f"{key.durable} · {key.reason} · {key.fingerprint}"
        raise UserError(f"unknown scope {scope!r}: entry or group")

    async def action(self, request: web.Request) -> web.Response:
        form = await request.post()
        verb = _field(form, "action") or ""
        if verb not in ("replay", "park", "discard"):
            raise UserError(f"unknown action {verb!r}: replay, park or discard")
        scope = _field(form, "scope") or ""
        reason = (_field(form, "reason") or "").strip()
        dry_run = _field(form, "dry_run") is not None
        rate = _rate(_field(form, "rate"), self.settings.console_replay_rate)
        entries, title = await self._targets(form, scope)
        if not entries:
            raise UserError(f"nothing to {verb}: the group has no open dead letters now", 404)
        plan = [(e, *data.predicted(verb, e["status"])) for e in entries]
        back = _field(form, "back") or "/failures"
        if dry_run:
            return self._render(
                request,
                "dry_run.html",
                verb=verb,
                title=title,
                plan=plan,
                allowed=sum(1 for _, ok, _ in plan if ok),
                form={
                    k: _field(form, k) or ""
                    for k in ("scope", "durable", "message_id", "reason_code", "fp", "back")
                },
                reason=reason,
                rate=rate,
                may_act=request[_SESSION_KEY].may_act,
            )
        session = self._operator(request)
        if not reason:
            raise UserError(f"give a reason to {verb} (it is recorded with the action)")
        if verb == "replay":
            return await self._replay(request, session, entries, title, reason, rate, scope)
        status = "parked" if verb == "park" else "discarded"
        results = []
        for row in entries:
            done, released = await dlq_ops.set_dead_letter_status(
                self.settings, self.topology, row, status, actor=session.actor, reason=reason
            )
            self.actions.labels(verb, "done" if done else "refused").inc()
            results.append((row, done, released))
        log.info("%s %s: %s", verb, title, reason, extra={"actor": session.actor})
        return self._render(
            request, "action_done.html", verb=verb, title=title, results=results, back=back
        )

    async def _replay(
        self,
        request: web.Request,
        session: Session,
        entries: list[dict[str, Any]],
        title: str,
        reason: str,
        rate: float,
        scope: str,
    ) -> web.Response:
        nc = self.nc
        if nc is None or not nc.is_connected:
            raise UserError("NATS is not connected: nothing can be replayed now", 503)

        async def replay_one(row: dict[str, Any]) -> str:
            done = await dlq_ops.replay_dead_letter(
                self.settings, self.topology, nc, row, actor=session.actor, reason=reason
            )
            self.actions.labels("replay", "done").inc()
            return done.subject

        if scope == "entry":
            row = entries[0]
            try:
                subject = await replay_one(row)
            except store.NotReplayable as exc:
                self.actions.labels("replay", "refused").inc()
                raise UserError(f"refused: {exc}", 409) from None
            log.info("replay %s: %s", title, reason, extra={"actor": session.actor})
            raise web.HTTPSeeOther(
                f"/failures/entry/{quote(row['durable'])}/{row['message_id']}"
                f"?{urlencode({'done': f'replayed on {subject}'})}"
            )
        job = self.jobs.start(
            entries,
            actor=session.actor,
            reason=reason,
            rate=rate,
            title=title,
            replay_one=replay_one,
        )
        log.info("bulk replay %s of %s (%s entries, %s/s): %s", job.id, title, len(entries),
                 rate, reason, extra={"actor": session.actor})  # fmt: skip
        raise web.HTTPSeeOther(f"/jobs/{job.id}")

    def _job(self, request: web.Request) -> Job:
        try:
            job = self.jobs.jobs.get(int(request.match_info["job_id"]))
        except ValueError:
            job = None
        if job is None:
            raise UserError(
                "no such replay job (jobs live in the console's memory: was it restarted?)",
                404,
            )
        return job

    async def job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        keys = [(e["durable"], e["message_id"]) for e in job.entries[:GROUP_PAGE]]
        now = await data.statuses_of(self.topology, self.pools, keys)
        return self._render(
            request,
            "job.html",
            job=job,
            entries=[
                (e, now.get((e["durable"], e["message_id"]))) for e in job.entries[:GROUP_PAGE]
            ],
            # Live while it runs and while its entries are being replayed.
            refresh=job.running
            or any(state.get("status") == "replaying" for state in now.values()),
        )

    async def job_list(self, request: web.Request) -> web.Response:
        jobs = sorted(self.jobs.jobs.values(), key=lambda j: j.id, reverse=True)
        return self._render(request, "jobs.html", jobs=jobs)

    async def cancel_job(self, request: web.Request) -> web.Response:
        session = self._operator(request)
        job = self._job(request)
        self.jobs.cancel(job.id)
        self.actions.labels("cancel", "done").inc()
        log.info("bulk replay %s cancelled", job.id, extra={"actor": session.actor})
        raise web.HTTPSeeOther(f"/jobs/{job.id}")

    async def discard_parked(self, request: web.Request) -> web.Response:
        session = self._operator(request)
        form = await request.post()
        durable = self._durable_param(_field(form, "durable"))
        key = _field(form, "key") or ""
        reason = (_field(form, "reason") or "").strip()
        if durable is None or not key:
            raise UserError("name the durable and the ordering key")
        if not reason:
            raise UserError("give a reason to discard a held head (it is recorded)")
        gone = await parked_ops.discard_parked_head(
            self.settings, durable, key, actor=session.actor, reason=reason
        )
        if gone is None:
            self.actions.labels("discard_parked", "refused").inc()
            raise UserError(
                f"refused: {durable} key {key!r} has no held head (not parked, or its head is "
                "retrying)",
                409,
            )
        self.actions.labels("discard_parked", "done").inc()
        log.info("discarded parked head %s of %s %s: %s", gone, durable, key, reason,
                 extra={"actor": session.actor})  # fmt: skip
        return self._render(
            request,
            "action_done.html",
            verb="discard",
            title=f"held head of {durable} key {key}",
            results=[({"durable": durable, "message_id": gone, "status": "held"}, True, key)],
            back="/failures",
        )

    # ------------------------------------------------------------------ events

    async def event_search(self, request: web.Request) -> web.Response:
        text = request.query.get("q", "").strip()
        results: list[dict[str, Any]] = []
        error = None
        if text:
            try:
                results = await data.search_events(self.topology, self.pools, text)
            except ValueError as exc:
                error = str(exc)
            if error is None and len(results) == 1:
                raise web.HTTPSeeOther(f"/event/{results[0]['message_id']}")
            if error is None and not results and data.parse_search(text)[0] == "id":
                # Not in an outbox: maybe only in an inbox, a dead letter or a stream.
                raise web.HTTPSeeOther(f"/event/{data.parse_search(text)[1]}")
        return self._render(
            request, "search.html", q=text, results=results, error=error, searched=bool(text)
        )

    async def event(self, request: web.Request) -> web.Response:
        message_id = new_message_id(request.match_info["message_id"])
        doc = await where_ops.journey(self.settings, self.topology, message_id)
        trace = doc.get("trace") or None
        spans: list[dict[str, Any]] = []
        link = None
        if trace:
            spans = await asyncio.to_thread(self._spans, trace["trace_id"])
            link = trace.get("url") or (
                f"{self.settings.console_jaeger_url.rstrip('/')}/trace/{trace['trace_id']}"
                if self.settings.console_jaeger_url
                else None
            )
        return self._render(
            request,
            "event.html",
            doc=doc,
            text=where_ops.render(doc),
            spans=spans,
            trace_link=link,
            spans_configured=bool(self.settings.console_spans_glob),
        )

    def _spans(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans of ``trace_id`` in the exported span files, as timeline rows."""
        pattern = self.settings.console_spans_glob
        if not pattern:
            return []
        wanted = "0x" + trace_id
        found = []
        for path in sorted(glob.glob(pattern))[:50]:
            try:
                with open(path, encoding="utf-8", errors="replace") as lines:
                    for line in lines:
                        if wanted not in line:
                            continue
                        try:
                            span = json.loads(line)
                        except ValueError:
                            continue
                        if span.get("context", {}).get("trace_id") == wanted:
                            found.append(span)
            except OSError:
                continue
        return timeline(found)

    # ------------------------------------------------------------------ KPI

    def _kpi_dir(self) -> Path | None:
        base = self.settings.console_kpi_dir
        return None if base is None else base / self.topology.name

    async def kpi(self, request: web.Request) -> web.Response:
        runs = await data.kpi_runs(self.topology, self.pools)
        report = None
        run_name = None
        base = self._kpi_dir()
        if base is not None and (base / "latest" / "report.json").is_file():
            latest = (base / "latest").resolve()
            run_name = latest.name
            try:
                report = json.loads((latest / "report.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                report = None
        plots = []
        if report is not None and run_name is not None and base is not None:
            plots = [n for n in ("latency.png", "windows.png") if (base / run_name / n).is_file()]
        return self._render(
            request,
            "kpi.html",
            runs=runs,
            report=report,
            run_name=run_name,
            plots=plots,
            kpi_dir_set=base is not None,
        )

    async def kpi_file(self, request: web.Request) -> web.StreamResponse:
        base = self._kpi_dir()
        run, name = request.match_info["run"], request.match_info["name"]
        if base is None or name not in ("latency.png", "windows.png") or not _plain_name(run):
            raise UserError("no such KPI plot", 404)
        path = base / run / name
        if not path.is_file():
            raise UserError("no such KPI plot", 404)
        return web.FileResponse(path, headers={"Cache-Control": "private, max-age=300"})


# --------------------------------------------------------------------------- helpers


def timeline(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans as rows of a timeline: offset and width in % of the trace, depth, service."""
    rows = []
    for span in spans:
        try:
            start = _span_time(span["start_time"])
            end = _span_time(span["end_time"])
        except (KeyError, ValueError, TypeError):
            continue
        rows.append(
            {
                "name": str(span.get("name", "?")),
                "service": str(
                    (span.get("resource") or {}).get("attributes", {}).get("service.name", "?")
                ),
                "span_id": (span.get("context") or {}).get("span_id"),
                "parent_id": span.get("parent_id"),
                "start": start,
                "end": max(end, start),
                "status": (span.get("status") or {}).get("status_code", "UNSET"),
            }
        )
    if not rows:
        return []
    rows.sort(key=lambda r: r["start"])
    first = rows[0]["start"]
    last = max(r["end"] for r in rows)
    total = max((last - first).total_seconds(), 1e-6)
    by_id = {r["span_id"]: r for r in rows}
    for row in rows:
        depth, parent = 0, by_id.get(row["parent_id"])
        while parent is not None and depth < 20:
            depth, parent = depth + 1, by_id.get(parent["parent_id"])
        row["depth"] = depth
        row["offset"] = 100 * (row["start"] - first).total_seconds() / total
        row["width"] = max(100 * (row["end"] - row["start"]).total_seconds() / total, 0.4)
        row["ms"] = (row["end"] - row["start"]).total_seconds() * 1000
        row["at_ms"] = (row["start"] - first).total_seconds() * 1000
    return rows


def _span_time(text: str) -> datetime:
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _field(source: Any, name: str) -> str | None:
    value = source.get(name) if source is not None else None
    return value if isinstance(value, str) else None


def _rate(text: str | None, default: float) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"the rate {text!r} is not a number (replays per second)") from None
    if not 0 < value <= 100:
        raise UserError("the rate must be above 0 and at most 100 replays per second")
    return value


def _safe_next(target: str | None) -> str:
    """A redirect target inside the console (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _plain_name(text: str) -> bool:
    return bool(text) and all(c.isalnum() or c in "-_.T:+" for c in text) and ".." not in text


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    value = float(seconds)
    if value < 60:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f} %"


def _short(text: Any, width: int = 140) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def uuid_or_none(text: str) -> uuid.UUID | None:
    """A UUID, or None when ``text`` is not one."""
    try:
        return uuid.UUID(text)
    except ValueError:
        return None
