"""The console's page of one durable: its pause, its circuit breaker per replica, and the
pause and resume buttons (``/durables/{durable}``).

Pausing and resuming go through the functions ``ferry durable pause|resume`` run
(:mod:`shared.ops.pause`), audited with the signed-in operator as the actor; a read-only
user sees the state and no form, and her POST is refused (403) before the form is read.
The breaker's state is what each live consumer process of the durable reported with its
heartbeat (``throttle_members``, :mod:`shared.adapters.circuits`).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from urllib.parse import quote

from aiohttp import web

from shared.adapters import circuits
from shared.adapters.jetstream import NATS_FAILURES
from shared.adapters.postgres import DATABASE_ERRORS
from shared.domain.errors import MalformedInput
from shared.domain.pause import describe_until, parse_until
from shared.ops.pause import PauseIncomplete, pause_durable, pause_state, resume_durable

from .host import Host
from .views import UserError, field

log = logging.getLogger("ferry.console")
#: What a pause or resume that did not finish raises: some consumer did not take it,
#: NATS or the database failed on the way.
_CHANGE_FAILED: tuple[type[BaseException], ...] = (
    PauseIncomplete,
    *NATS_FAILURES,
    *DATABASE_ERRORS,
)
#: A consumer process not seen for this long is not shown (its heartbeat is every few s).
ALIVE = 30.0


class DurablePages:
    """``/durables/{durable}`` and its two actions."""

    def __init__(self, console: Host) -> None:
        self.console = console

    def add_routes(self, r: web.UrlDispatcher) -> None:
        """The page's routes."""
        r.add_get("/durables/{durable}", self.page)
        r.add_post("/durables/{durable}/pause", self.pause)
        r.add_post("/durables/{durable}/resume", self.resume)

    def _durable(self, request: web.Request) -> str:
        name = request.match_info["durable"]
        if name not in self.console.topology.durables:
            raise UserError(
                f"no durable {name[:100]!r} in topology {self.console.topology.name}", 404
            )
        return name

    def _nc(self) -> Any:
        nc = self.console.nc
        if nc is None or not nc.is_connected:
            raise UserError("NATS is not connected: the pause cannot be read or changed now", 503)
        return nc

    async def page(self, request: web.Request) -> web.Response:
        durable = self._durable(request)
        console, topology = self.console, self.console.topology
        state = await pause_state(console.settings, topology, self._nc(), durable)
        replicas, error = await self._replicas(durable)
        return console.render(
            request,
            "durable.html",
            durable=durable,
            spec=topology.durables[durable],
            state=state,
            until=describe_until(state.until) if state.paused else "",
            replicas=replicas,
            replicas_error=error,
            describe_until=describe_until,
        )

    async def _replicas(self, durable: str) -> tuple[list[dict[str, Any]], str | None]:
        spec = self.console.topology.durables[durable]
        pool = self.console.pools[self.console.topology.context(spec.target).database]
        try:
            async with pool.acquire() as conn:
                found = await circuits.circuits(conn, [durable], alive=ALIVE)
        except DATABASE_ERRORS as exc:
            return [], f"{type(exc).__name__}: {exc}"[:200]
        return found.get(durable, []), None

    async def pause(self, request: web.Request) -> web.Response:
        session = self.console.operator(request)  # a read-only user: 403, nothing read
        durable = self._durable(request)
        form = await request.post()
        reason = self._reason(form, "pause")
        text = (field(form, "until") or "").strip()
        until: datetime | None = None
        if text:
            try:
                until = parse_until(text)
            except MalformedInput as exc:
                raise UserError(f"refused: {exc}") from None
        try:
            state = await pause_durable(
                self.console.settings, self.console.topology, self._nc(), durable, until,
                actor=session.actor, reason=reason,
            )  # fmt: skip
        except _CHANGE_FAILED as exc:
            return self._failed("pause", exc)
        self.console.actions.labels("pause", "done").inc()
        shown = describe_until(state.until)
        self.console.log_action(f"pause {durable} {shown}: {reason}", session.actor)
        return self._back(durable, f"paused {shown} on {len(state.consumers)} consumer(s)")

    async def resume(self, request: web.Request) -> web.Response:
        session = self.console.operator(request)
        durable = self._durable(request)
        reason = self._reason(await request.post(), "resume")
        try:
            state = await resume_durable(
                self.console.settings, self.console.topology, self._nc(), durable,
                actor=session.actor, reason=reason,
            )  # fmt: skip
        except _CHANGE_FAILED as exc:
            return self._failed("resume", exc)
        self.console.actions.labels("resume", "done").inc()
        self.console.log_action(f"resume {durable}: {reason}", session.actor)
        return self._back(durable, f"resumed on {len(state.consumers)} consumer(s)")

    @staticmethod
    def _reason(form: Any, verb: str) -> str:
        reason = (field(form, "reason") or "").strip()
        if not reason:
            raise UserError(f"give a reason to {verb} (it is recorded with the action)")
        return reason

    def _failed(self, verb: str, exc: BaseException) -> web.Response:
        self.console.actions.labels(verb, "failed").inc()
        raise UserError(f"{verb} did not finish: {exc}"[:500], 502)

    def _back(self, durable: str, note: str) -> web.Response:
        page = f"/durables/{quote(durable)}"
        moved = web.HTTPSeeOther(page)
        self.console.leave_note(moved, note, page)
        raise moved
