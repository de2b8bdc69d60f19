"""The console's dead-letter pages: failure groups, one entry, the actions, bulk replay jobs.

Every action goes through the use-cases the ``ferry`` CLI runs (:mod:`shared.ops.dlq`,
:mod:`shared.ops.parked`) and needs an operator; a read-only user may look and dry-run.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import quote

from aiohttp import web

from shared.adapters import dead_letters as store
from shared.ops import dlq as dlq_ops
from shared.ops import parked as parked_ops

from . import data
from .auth import Session
from .edits import EditPages
from .host import Host
from .jobs import Job, new_message_id
from .views import UserError, field, rate_param

log = logging.getLogger("ferry.console")
#: Most entries one action (a group) may take at once.
MAX_ENTRIES = 10_000
#: Most entries a group page lists.
GROUP_PAGE = 500


class FailurePages:
    """``/failures``, ``/jobs`` and ``/parked``: what failed, and what an operator does about it."""

    def __init__(self, console: Host) -> None:
        self.console = console
        self.settings, self.topology, self.pools = console.settings, console.topology, console.pools
        self.actions, self.jobs = console.actions, console.jobs
        self.render_seconds = console.render_seconds

    def add_routes(self, r: web.UrlDispatcher) -> None:
        """The pages' routes."""
        r.add_get("/failures", self.failures)
        r.add_get("/failures/group", self.group)
        r.add_get("/failures/entry/{durable}/{message_id}", self.entry)
        r.add_post("/failures/action", self.action)
        r.add_get("/jobs", self.job_list)
        r.add_get("/jobs/{job_id}", self.job)
        r.add_post("/jobs/{job_id}/cancel", self.cancel_job)
        r.add_post("/parked/discard", self.discard_parked)
        EditPages(self.console).add_routes(r)

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
        return self.console.render(
            request,
            "failures.html",
            groups=groups,
            parked=parked,
            durables=sorted(self.topology.durables),
            filters={"durable": durable or "", "reason": reason or "", "status": status},
        )

    def _group_key(self, source: Any) -> data.GroupKey:
        durable = self._durable_param(field(source, "durable"))
        reason, fingerprint = field(source, "reason_code"), field(source, "fp")
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
        return self.console.render(
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
        envelope = store.current_envelope(record)
        return self.console.render(
            request,
            "entry.html",
            row=row,
            record=record,
            payload=json.dumps(record.get("payload"), indent=2, default=str),
            history=record.get("retryHistory") or [],
            default_rate=self.settings.console_replay_rate,
            # Only the actions its status allows (a replayed one is final: none).
            verbs=[v for v in ("replay", "park", "discard") if data.predicted(v, row["status"])[0]],
            # Edit-and-retry: an envelope to edit, from a status a replay may start from.
            edit_payload=json.dumps(envelope.get("payload"), indent=2, ensure_ascii=False)
            if envelope is not None and data.predicted("replay", row["status"])[0]
            else None,
        )

    async def _targets(self, form: Any, scope: str) -> tuple[list[dict[str, Any]], str]:
        """The entries an action names (one entry, or a group's open ones) and a title."""
        if scope == "entry":
            durable = self._durable_param(field(form, "durable"))
            message_id = new_message_id(field(form, "message_id") or "")
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
        verb = field(form, "action") or ""
        if verb not in ("replay", "park", "discard"):
            raise UserError(f"unknown action {verb!r}: replay, park or discard")
        scope = field(form, "scope") or ""
        reason = (field(form, "reason") or "").strip()
        dry_run = field(form, "dry_run") is not None
        rate = rate_param(field(form, "rate"), self.settings.console_replay_rate)
        entries, title = await self._targets(form, scope)
        if not entries:
            raise UserError(f"nothing to {verb}: the group has no open dead letters now", 404)
        plan = [(e, *data.predicted(verb, e["status"])) for e in entries]
        back = field(form, "back") or "/failures"
        if dry_run:
            return self.console.render(
                request,
                "dry_run.html",
                verb=verb,
                title=title,
                plan=plan,
                allowed=sum(1 for _, ok, _ in plan if ok),
                form={
                    k: field(form, k) or ""
                    for k in ("scope", "durable", "message_id", "reason_code", "fp", "back")
                },
                reason=reason,
                rate=rate,
                may_act=self.console.session_of(request).may_act,
            )
        session = self.console.operator(request)
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
        return self.console.render(
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
        nc = self.console.nc
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
            page = f"/failures/entry/{quote(row['durable'])}/{row['message_id']}"
            done = web.HTTPSeeOther(page)
            self.console.leave_note(done, f"replayed on {subject}", page)
            raise done
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
        return self.console.render(
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
        return self.console.render(request, "jobs.html", jobs=jobs)

    async def cancel_job(self, request: web.Request) -> web.Response:
        session = self.console.operator(request)
        job = self._job(request)
        self.jobs.cancel(job.id)
        self.actions.labels("cancel", "done").inc()
        log.info("bulk replay %s cancelled", job.id, extra={"actor": session.actor})
        raise web.HTTPSeeOther(f"/jobs/{job.id}")

    async def discard_parked(self, request: web.Request) -> web.Response:
        session = self.console.operator(request)
        form = await request.post()
        durable = self._durable_param(field(form, "durable"))
        key = field(form, "key") or ""
        reason = (field(form, "reason") or "").strip()
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
        return self.console.render(
            request,
            "action_done.html",
            verb="discard",
            title=f"held head of {durable} key {key}",
            results=[({"durable": durable, "message_id": gone, "status": "held"}, True, key)],
            back="/failures",
        )
