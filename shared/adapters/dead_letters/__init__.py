"""The dead-letter store: one record per (durable, message_id), and replays of it.

    record   recording a dead letter, once, whichever path comes first (consumer, router, sweep)
    records  the record on the wire: UTF-8 JSON that always fits, or the payload by reference
    replay   replays, their confirmation and settlement, park and discard
    edit     edit-and-retry: a replay with an operator's payload, both versions audited
    audit    the actions taken on dead letters (``dead_letter_actions``)
    groups   the failure groups' counts, kept as dead letters change (the Failures page)
    query    finding dead letters and their actions (operator CLI, ``ferry where``)

The pure policy (which reasons are replayable, the replay back-off, the starting status,
the statuses each action may start from) is :mod:`shared.domain.dead_letter`. Callers
import the package (``from shared.adapters import dead_letters``) and use
``dead_letters.X``.
"""

from shared.adapters.dead_letters.edit import (
    Edit,
    EditCheck,
    EditRefused,
    current_envelope,
    edit_plan,
    edits,
)
from shared.adapters.dead_letters.groups import fold_groups
from shared.adapters.dead_letters.query import Query, actions, find, subject_regex
from shared.adapters.dead_letters.record import (
    Failure,
    Outcome,
    Source,
    initial_status,
    record_dead_letter,
    replay_delay,
)
from shared.adapters.dead_letters.replay import (
    NoEnvelope,
    NotReplayable,
    Replayed,
    replay,
    republish_unconfirmed,
    set_status,
    settle_replayed,
)
from shared.domain.dead_letter import FINAL_STATUSES, NOT_REPLAYABLE, REPLAYABLE_STATUSES

__all__ = [
    "FINAL_STATUSES",
    "NOT_REPLAYABLE",
    "REPLAYABLE_STATUSES",
    "Edit",
    "EditCheck",
    "EditRefused",
    "Failure",
    "NoEnvelope",
    "NotReplayable",
    "Outcome",
    "Query",
    "Replayed",
    "Source",
    "actions",
    "current_envelope",
    "edit_plan",
    "edits",
    "find",
    "fold_groups",
    "initial_status",
    "record_dead_letter",
    "replay",
    "replay_delay",
    "republish_unconfirmed",
    "set_status",
    "settle_replayed",
    "subject_regex",
]
