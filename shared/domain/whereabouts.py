"""Where one expected delivery is: the one definition every reader of the records shares.

An *expected delivery* is an outbox event and a durable that should receive it. The demo's
reckoning, the KPI job (:mod:`spark.transforms` builds the same rules as a Spark column and
a test holds the two equal on every combination), ``ferry where`` and the console all name
its place with :func:`place_of`, from what the records say:

=================  ===========================================================================
place              when (the first rule that matches, in this order)
=================  ===========================================================================
processed          its inbox row is ``processed``
dead-lettered      it has a dead letter, or its inbox row is ``failed`` (the dead letter's
                   status says what comes next: dead, held, replaying, replayed, parked,
                   discarded)
parked             it waits in ``parked_messages`` behind its key's head (or is that head,
                   retrying); *behind a held head* when the head waits for an operator
retrying           its inbox row is not final and a delivery of it has failed before
in flight          its inbox row is not final and nothing failed yet; or it is published and
                   not received yet, within the grace period or still in the stream
not published      its outbox row is not published yet (waiting, or set aside)
lost               published, past the grace period, and no inbox row, dead letter, parked
                   row or (where one looked) stream message accounts for it
=================  ===========================================================================

"Lost" is exact: nothing parked, held, retrying or in flight is ever called lost. An inbox
row that is not final is a record of the event; where the stream was looked at and holds
it no more (and nothing parked it), nothing will deliver it again, and that is lost too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Place(StrEnum):
    """Where an expected delivery is (see the module's table)."""

    PROCESSED = "processed"
    DEAD_LETTERED = "dead-lettered"
    PARKED = "parked"
    RETRYING = "retrying"
    IN_FLIGHT = "in flight"
    NOT_PUBLISHED = "not published"
    LOST = "lost"


#: In the order summaries list them.
PLACES: tuple[Place, ...] = tuple(Place)
#: Inbox statuses that end a delivery (the rest: received, processing, retrying).
FINAL_INBOX = frozenset({"processed", "failed"})
#: Dead-letter statuses by what an operator should read.
DEAD_LETTER_MEANING = {
    "dead": "waiting for its automatic replay",
    "held": "held for an operator",
    "replaying": "replay in flight",
    "replayed": "replayed, then processed",
    "parked": "automatic replays used up, held for an operator",
    "discarded": "discarded by an operator",
}


@dataclass(frozen=True)
class Trail:
    """What the records say of one expected delivery.

    ``in_stream``: None where nobody looked at the stream (the demo, the KPI job); True or
    False where ``ferry where`` did. ``past_grace``: published long enough ago that its
    delivery should have been recorded by now.
    """

    published: bool
    inbox_status: str | None = None
    retried: bool = False
    dead_letter_status: str | None = None
    parked_state: str | None = None
    in_stream: bool | None = None
    past_grace: bool = True


def place_of(trail: Trail) -> Place:
    """The place of one expected delivery (the module's table, first match wins)."""
    status = trail.inbox_status
    if status == "processed":
        return Place.PROCESSED
    if trail.dead_letter_status is not None or status == "failed":
        return Place.DEAD_LETTERED
    if trail.parked_state is not None:
        return Place.PARKED
    if status is not None:
        if trail.in_stream is False and trail.past_grace:
            return Place.LOST  # not final, not parked, and the stream will not deliver it
        if trail.retried or status == "retrying":
            return Place.RETRYING
        return Place.IN_FLIGHT
    if not trail.published:
        return Place.NOT_PUBLISHED
    if trail.in_stream or not trail.past_grace:
        return Place.IN_FLIGHT
    return Place.LOST
