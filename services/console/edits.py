"""Edit-and-retry in the console: ``POST /failures/edit`` replaces one dead letter's payload
and replays it, through the function ``ferry dlq edit`` runs (:mod:`shared.ops.dlq_edit`):
checked against the schema of the event's type and version, audited with both versions.
Only an operator may; a read-only user is refused (403) before the form is read.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from aiohttp import web

from shared.adapters import dead_letters as store
from shared.domain.dead_letter_edit import parse_edited_payload
from shared.domain.errors import MalformedInput
from shared.ops import dlq as dlq_ops
from shared.ops.dlq_edit import edit_dead_letter

from .host import Host
from .jobs import new_message_id
from .views import UserError, field

log = logging.getLogger("ferry.console")


class EditPages:
    """The edit form's target (the form is on the dead letter's page, ``entry.html``)."""

    def __init__(self, console: Host) -> None:
        self.console = console

    def add_routes(self, r: web.UrlDispatcher) -> None:
        """The route of the edit."""
        r.add_post("/failures/edit", self.edit)

    async def edit(self, request: web.Request) -> web.Response:
        session = self.console.operator(request)  # a read-only user: 403, nothing read
        form = await request.post()
        console, topology = self.console, self.console.topology
        durable = field(form, "durable") or ""
        if durable not in topology.durables:
            raise UserError(f"no durable {durable!r} in topology {topology.name}")
        message_id = new_message_id(field(form, "message_id") or "")
        reason = (field(form, "reason") or "").strip()
        if not reason:
            raise UserError("give a reason to edit it (it is recorded with the edit)")
        try:
            payload = parse_edited_payload(field(form, "payload") or "")
        except MalformedInput as exc:
            raise UserError(f"refused: {exc}", 422) from None
        rows = await dlq_ops.find_dead_letters(
            console.settings, store.Query(durables=[durable], message_ids=[message_id])
        )
        if not rows:
            raise UserError(f"no dead letter {durable}/{message_id}", 404)
        nc = console.nc
        if nc is None or not nc.is_connected:
            raise UserError("NATS is not connected: nothing can be replayed now", 503)
        try:
            done = await edit_dead_letter(
                console.settings, topology, nc, rows[0], payload, actor=session.actor,
                reason=reason,
            )  # fmt: skip
        except store.EditRefused as exc:  # the schema, no change, another ordering key
            console.actions.labels("edit", "refused").inc()
            raise UserError(f"refused: {exc}", 422) from None
        except store.NotReplayable as exc:  # final (replayed, discarded) or replaying
            console.actions.labels("edit", "refused").inc()
            raise UserError(f"refused: {exc}", 409) from None
        console.actions.labels("edit", "done").inc()
        log.info("edit %s/%s (%s): %s", durable, message_id, ", ".join(done.changed), reason,
                 extra={"actor": session.actor})  # fmt: skip
        page = f"/failures/entry/{quote(durable)}/{message_id}"
        moved = web.HTTPSeeOther(page)
        console.leave_note(
            moved, f"edited ({', '.join(done.changed)}) and replayed on {done.subject}", page
        )
        raise moved
