"""Edit-and-retry of one dead letter (``ferry dlq edit``, the console; issue 45).

An operator gives a new payload; it must fit the schema of the event's type and version
as the durable's consumer checks it (the registry's validators,
:func:`shared.contracts.events.accepted_events`) and, for an ``ordering: key`` durable,
keep the event's ordering key. Then it is replayed like any replay — same message id, so
the inbox claim still stands between the edited event and a double apply — with the edit
audited in ``dead_letter_edits`` (both versions, who, when, why) and as an ``edit``
action in ``dead_letter_actions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.adapters import dead_letters as store
from shared.contracts.events import accepted_events
from shared.contracts.topology import Topology
from shared.domain.dead_letter import REPLAYABLE_STATUSES
from shared.domain.dead_letter_edit import payload_diff
from shared.domain.ordering import OrderingKeyError, ordering_key
from shared.ops.dlq_change import replay_dead_letter
from shared.runtime.settings import CommonSettings


@dataclass(frozen=True)
class EditPlan:
    """What an edit would replay: the payload now and after, what changed, as a diff."""

    before: Any
    after: dict[str, Any]
    changed: list[str]
    diff: list[str]


def edit_check(topology: Topology, durable: str) -> store.EditCheck:
    """The checks of an edit of ``durable``'s dead letter, as its consumer would judge the
    edited envelope: an event it handles, a payload its schema takes, the same ordering
    key (an ``ordering: key`` durable)."""
    accepted = accepted_events(topology, durable)
    spec = topology.durable(durable)

    def check(before: dict[str, Any], after: dict[str, Any]) -> None:
        key = (after.get("event_type"), after.get("event_version"))
        if accepted is not None:
            if key not in accepted:
                raise store.EditRefused(f"{durable} handles no {key[0]}.v{key[1]}")
            problem = accepted.payload_error(key, after["payload"])  # type: ignore[arg-type]
            if problem is not None:
                raise store.EditRefused(f"the edited payload fails its schema: {problem}")
        if spec.ordering == "key":
            _same_key(topology, durable, before, after)

    return check


def _same_key(topology: Topology, durable: str, before: Any, after: dict[str, Any]) -> None:
    context = topology.context_of_stream(topology.durable(durable).stream)
    event_type, version = after.get("event_type"), after.get("event_version")
    field = None
    if isinstance(event_type, str) and isinstance(version, int):
        field = topology.ordering_field(context, event_type, version)
    keys = []
    for doc in (before, after):
        try:
            keys.append(ordering_key(doc, field))
        except OrderingKeyError as exc:
            keys.append(f"<unreadable: {exc}>")
    if keys[0] != keys[1]:
        where = f"payload.{field}" if field else "its aggregate"
        raise store.EditRefused(
            f"the edit changes the ordering key ({where}) from {keys[0]!r} to {keys[1]!r}: "
            "an edit may not move an event to another key"
        )


def plan_edit(topology: Topology, row: dict[str, Any], payload: dict[str, Any]) -> EditPlan:
    """Check an edit of ``row`` (a dead letter as :func:`store.find` returns it) without
    changing anything (``--dry-run``, the before/after shown); :class:`store.EditRefused`
    or :class:`store.NotReplayable` when it may not be replayed."""
    if row["status"] not in REPLAYABLE_STATUSES:
        raise store.NotReplayable(
            f"{row['durable']}/{row['message_id']} is {row['status']}; "
            f"editable from: {', '.join(REPLAYABLE_STATUSES)}"
        )
    check = edit_check(topology, row["durable"])
    before, after, changed = store.edit_plan(row["record"], store.Edit(payload, check))
    return EditPlan(before.get("payload"), after["payload"], changed,
                    payload_diff(before.get("payload"), after["payload"]))  # fmt: skip


async def edit_dead_letter(
    settings: CommonSettings,
    topology: Topology,
    nc: Any,
    row: dict[str, Any],
    payload: dict[str, Any],
    *,
    actor: str,
    reason: str,
) -> store.Replayed:
    """Replay one dead letter with ``payload`` for its payload, the edit audited;
    :class:`store.EditRefused` or :class:`store.NotReplayable` (nothing changed) when it
    may not be."""
    edit = store.Edit(payload, edit_check(topology, row["durable"]))
    return await replay_dead_letter(
        settings, topology, nc, row, actor=actor, reason=reason, edit=edit
    )
