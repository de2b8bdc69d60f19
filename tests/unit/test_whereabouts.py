"""The one definition of where an expected delivery is (shared.domain.whereabouts)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.whereabouts import Place, Trail, place_of

INBOX = (None, "received", "processing", "retrying", "processed", "failed")
DEAD = (None, "dead", "held", "replaying", "replayed", "parked", "discarded")
PARKED = (None, "queued", "retrying", "held")

trails = st.builds(
    Trail,
    published=st.booleans(),
    inbox_status=st.sampled_from(INBOX),
    retried=st.booleans(),
    dead_letter_status=st.sampled_from(DEAD),
    parked_state=st.sampled_from(PARKED),
    in_stream=st.sampled_from((None, True, False)),
    past_grace=st.booleans(),
)


@pytest.mark.parametrize(
    ("trail", "place"),
    [
        (Trail(published=True, inbox_status="processed"), Place.PROCESSED),
        # A replayed dead letter whose replay was processed: processed.
        (Trail(True, "processed", dead_letter_status="replayed"), Place.PROCESSED),
        (Trail(True, "failed", dead_letter_status="held"), Place.DEAD_LETTERED),
        (Trail(True, "received", dead_letter_status="replaying"), Place.DEAD_LETTERED),
        # Behind a held head: its inbox row says received, its parked row says where.
        (Trail(True, "received", parked_state="queued"), Place.PARKED),
        (Trail(True, None, parked_state="queued"), Place.PARKED),
        (Trail(True, "retrying", retried=True), Place.RETRYING),
        (Trail(True, "received", retried=True), Place.RETRYING),
        (Trail(True, "processing"), Place.IN_FLIGHT),
        (Trail(True, None, past_grace=False), Place.IN_FLIGHT),
        (Trail(True, None, in_stream=True), Place.IN_FLIGHT),
        (Trail(False), Place.NOT_PUBLISHED),
        # Nothing accounts for it after the grace period: lost.
        (Trail(True, None), Place.LOST),
        (Trail(True, None, in_stream=False), Place.LOST),
        # Received, not final, not parked, and the stream will not deliver it again.
        (Trail(True, "received", in_stream=False), Place.LOST),
        (Trail(True, "received", in_stream=False, past_grace=False), Place.IN_FLIGHT),
    ],
)
def test_each_place(trail: Trail, place: Place) -> None:
    assert place_of(trail) is place


@given(trails)
def test_lost_only_when_no_record_accounts_for_it(trail: Trail) -> None:
    place = place_of(trail)
    if place is Place.LOST:
        # Published: the outbox says so, or an inbox row proves it reached the stream
        # (the outbox's mark can lag behind the delivery).
        assert trail.published or trail.inbox_status is not None
        assert trail.past_grace
        assert trail.dead_letter_status is None and trail.parked_state is None
        assert trail.inbox_status not in ("processed", "failed")
        assert trail.in_stream is not True
        assert trail.inbox_status is None or trail.in_stream is False


@given(trails)
def test_a_record_that_settles_it_wins(trail: Trail) -> None:
    place = place_of(trail)
    if trail.inbox_status == "processed":
        assert place is Place.PROCESSED
    elif trail.dead_letter_status is not None:
        assert place is Place.DEAD_LETTERED
    elif trail.parked_state is not None and trail.inbox_status != "failed":
        assert place is Place.PARKED
