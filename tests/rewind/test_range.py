"""The rewind's time and range arguments (``ferry durable rewind``): parsed and checked
before anything touches a server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.js.errors import NotFoundError

from shared.cli.rewind import _Meter
from shared.domain.errors import ConfigurationError, MalformedInput
from shared.ops.rewind_range import (
    Kept,
    RewindRange,
    RewindRefused,
    check_kept,
    check_range,
    first_seq_at,
    parse_when,
)

NOW = datetime(2026, 11, 26, 17, 0, tzinfo=UTC)
aware = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    ),
)


@given(aware)
def test_an_iso_time_with_its_timezone_is_read_as_that_instant(moment: datetime) -> None:
    assert parse_when(moment.isoformat(), NOW) == moment
    if moment.utcoffset() == timedelta(0):
        text = moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
        assert parse_when(text, NOW) == moment


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1)))
def test_an_iso_time_without_a_timezone_is_refused(moment: datetime) -> None:
    with pytest.raises(MalformedInput, match="no timezone"):
        parse_when(moment.isoformat(), NOW)


@given(st.integers(0, 10_000), st.sampled_from(["s", "m", "h", "d"]))
def test_a_duration_means_that_long_before_now(amount: int, unit: str) -> None:
    seconds = amount * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert parse_when(f"{amount}{unit}", NOW) == NOW - timedelta(seconds=seconds)


@given(st.text(max_size=40))
def test_any_text_is_a_time_or_a_clear_refusal(text: str) -> None:
    try:
        moment = parse_when(text, NOW)
    except MalformedInput as exc:
        assert str(exc)
    else:
        assert moment.tzinfo is not None


def test_examples() -> None:
    assert parse_when("2h", NOW) == NOW - timedelta(hours=2)
    assert parse_when("2026-11-26T16:00:00+01:00", NOW) == datetime(2026, 11, 26, 15, tzinfo=UTC)
    for bad in ("", "yesterday", "2026-11-26T16:00:00", "2026-13-01T00:00:00Z", "-2h"):
        with pytest.raises(MalformedInput):
            parse_when(bad, NOW)


times = st.none() | st.datetimes(
    min_value=datetime(2026, 11, 20), max_value=datetime(2026, 12, 2), timezones=st.just(UTC)
)
seqs = st.none() | st.integers(-2, 50)


@given(times, seqs, times, seqs)
def test_check_range_refuses_exactly_the_ranges_that_make_no_sense(
    since: datetime | None, from_seq: int | None, until: datetime | None, until_seq: int | None
) -> None:
    wrong = (
        (since is None) == (from_seq is None)
        or (until is not None and until_seq is not None)
        or (since is not None and since > NOW)
        or (from_seq is not None and from_seq < 1)
        or (until_seq is not None and until_seq < 1)
        or (since is not None and until is not None and until < since)
        or (from_seq is not None and until_seq is not None and until_seq < from_seq)
    )
    try:
        check_range(RewindRange(since, from_seq, until, until_seq), now=NOW)
    except RewindRefused as exc:
        assert wrong, f"refused a sensible range: {exc}"
        assert isinstance(exc, ConfigurationError)  # the CLI's exit code 2
    else:
        assert not wrong, "accepted a range that makes no sense"


def test_refusals_say_why() -> None:
    def refused(**kw: Any) -> str:
        with pytest.raises(RewindRefused) as caught:
            check_range(RewindRange(**kw), now=NOW)
        return str(caught.value)

    assert "exactly one start" in refused()
    assert "exactly one start" in refused(since=NOW, from_seq=3)
    assert "in the future" in refused(since=NOW + timedelta(minutes=1))
    assert "before --since" in refused(since=NOW, until=NOW - timedelta(seconds=1))
    assert "before --from-seq" in refused(from_seq=5, until_seq=4)


FIRST = datetime(2026, 11, 26, 12, tzinfo=UTC)


@given(st.integers(1, 100), st.integers(1, 100))
def test_a_start_before_what_the_stream_keeps_is_refused_naming_what_is_left(
    first_seq: int, from_seq: int
) -> None:
    kept = Kept(first_seq, first_seq + 9, FIRST)
    if first_seq > 1 and from_seq < first_seq:
        with pytest.raises(RewindRefused) as caught:
            check_kept("S", kept, RewindRange(from_seq=from_seq))
        text = str(caught.value)
        assert f"{first_seq}..{first_seq + 9}" in text
        assert FIRST.isoformat() in text
    else:
        check_kept("S", kept, RewindRange(from_seq=from_seq))


def test_a_stream_that_lost_nothing_takes_any_since() -> None:
    check_kept("S", Kept(1, 10, FIRST), RewindRange(since=FIRST - timedelta(days=30)))
    with pytest.raises(RewindRefused, match=r"keeps sequences 2\.\.10"):
        check_kept("S", Kept(2, 10, FIRST), RewindRange(since=FIRST - timedelta(seconds=1)))
    check_kept("S", Kept(2, 10, FIRST), RewindRange(since=FIRST))


def test_the_progress_line_gives_done_selected_and_the_rate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    meter = _Meter(dry_run=False, every=0.0)
    meter(1500, 20000)
    dry = _Meter(dry_run=True, every=0.0)
    dry(7, 7)
    quiet = _Meter(dry_run=False, every=3600.0)
    quiet(1, 2)  # within its second: nothing
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("rewind: published 1500/20000 selected (") and "/s)" in lines[0]
    assert lines[1].startswith("rewind: counted 7/7 selected (")


class _StoredStream:
    """What ``first_seq_at`` asks of JetStream: the first stored message at or after a
    sequence (deleted sequences skipped), with the time the server stored it at."""

    def __init__(self, stored: dict[int, datetime]) -> None:
        self.stored = stored

    async def get_msg(self, stream: str, seq: int, next: bool) -> Any:
        assert next
        after = [s for s in sorted(self.stored) if s >= seq]
        if not after:
            raise NotFoundError()
        return SimpleNamespace(seq=after[0], time=self.stored[after[0]])


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=60),
    st.integers(1, 20),
    st.integers(-1, 200),
)
def test_first_seq_at_splits_the_stored_messages_at_the_moment(
    steps: list[tuple[bool, int]], first: int, at: int
) -> None:
    stored: dict[int, datetime] = {}
    clock = 0
    for offset, (kept, tick) in enumerate(steps):
        clock += tick  # stored times never go back
        if kept:
            stored[first + offset] = FIRST + timedelta(seconds=clock)
    last = first + len(steps) - 1
    kept_ = Kept(min(stored, default=last + 1), last, None)
    moment = FIRST + timedelta(seconds=at)
    found = asyncio.run(first_seq_at(_StoredStream(stored), "S", kept_, moment))  # type: ignore[arg-type]
    assert kept_.first_seq <= found <= last + 1
    assert all(t < moment for s, t in stored.items() if s < found)
    assert all(t >= moment for s, t in stored.items() if s >= found)
