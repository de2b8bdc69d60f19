"""The range of a rewind (``ferry durable rewind``, :mod:`shared.ops.rewind`): its
arguments parsed and checked, what the stream still keeps, and the range turned into stream
sequences by reading the stream; :class:`RewindRefused` when the range is refused."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.adapters.jetstream import NOT_FOUND_ERRORS, JetStream
from shared.contracts.topology import Topology
from shared.domain.durations import parse_duration, parse_instant
from shared.domain.errors import ConfigurationError, MalformedInput
from shared.domain.ordering import all_partitions_filter
from shared.domain.subjects import REPLAY_PREFIX

_NATIVE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")


class RewindRefused(ConfigurationError):
    """The rewind was refused before anything was published (the message says why)."""


# --------------------------------------------------------------------------- the range


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time with its timezone (``2026-11-26T17:00:00Z``), or a duration ago
    (``2h``, ``90m``, ``1d``); :class:`MalformedInput` otherwise. A time without a timezone
    is refused: whose clock it means cannot be guessed."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedInput("a time must be ISO-8601 with a timezone or a duration ago (2h)")
    text = text.strip()
    now = now or datetime.now(UTC)
    if not _NATIVE_TIME.match(text):
        try:
            seconds = parse_duration(text)
        except MalformedInput:
            raise MalformedInput(
                f"{text[:60]!r} is neither an ISO-8601 time with a timezone nor a duration "
                "ago such as 2h"
            ) from None
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise MalformedInput(f"{text[:60]!r} reaches before year 1") from None
    return parse_instant(text)


@dataclass(frozen=True)
class RewindRange:
    """A rewind's range as given: one start (``since`` a time, or ``from_seq`` a stream
    sequence) and at most one end (``until`` a time, or ``until_seq`` a sequence, inclusive;
    none: the stream's last sequence when the rewind starts). :func:`check_range` checks it."""

    since: datetime | None = None
    from_seq: int | None = None
    until: datetime | None = None
    until_seq: int | None = None


def check_range(span: RewindRange, *, now: datetime) -> None:
    """Refuse a range that makes no sense (:class:`RewindRefused`), before any I/O."""
    since, from_seq = span.since, span.from_seq
    until, until_seq = span.until, span.until_seq
    if (since is None) == (from_seq is None):
        raise RewindRefused("give exactly one start: --since TIME or --from-seq N")
    if until is not None and until_seq is not None:
        raise RewindRefused("give at most one end: --until TIME or --until-seq N")
    for name, moment in (("--since", since), ("--until", until)):
        if moment is not None and moment.tzinfo is None:
            raise RewindRefused(f"{name} needs a timezone")
    if since is not None and since > now:
        raise RewindRefused(f"--since {since.isoformat()} is in the future (now {now.isoformat()})")
    if from_seq is not None and from_seq < 1:
        raise RewindRefused(f"--from-seq must be 1 or more, not {from_seq}")
    if until_seq is not None and until_seq < 1:
        raise RewindRefused(f"--until-seq must be 1 or more, not {until_seq}")
    if since is not None and until is not None and until < since:
        raise RewindRefused(f"--until {until.isoformat()} is before --since {since.isoformat()}")
    if from_seq is not None and until_seq is not None and until_seq < from_seq:
        raise RewindRefused(f"--until-seq {until_seq} is before --from-seq {from_seq}")


@dataclass(frozen=True)
class Kept:
    """What a stream still keeps."""

    first_seq: int
    last_seq: int
    #: When the first kept message was stored (None: the stream is empty).
    first_time: datetime | None

    def describe(self) -> str:
        if self.first_time is None:
            return f"the stream is empty (its next sequence is {self.last_seq + 1})"
        return (
            f"the stream keeps sequences {self.first_seq}..{self.last_seq}, the first stored "
            f"at {self.first_time.isoformat()}"
        )


def check_kept(stream: str, kept: Kept, span: RewindRange) -> None:
    """Refuse a start older than what the stream keeps: part of the range is gone. A
    stream that still holds its sequence 1 has lost nothing, whatever ``since`` says."""
    since, from_seq = span.since, span.from_seq
    if kept.first_seq <= 1:
        return
    if from_seq is not None and from_seq < kept.first_seq:
        raise RewindRefused(
            f"--from-seq {from_seq} is older than what {stream} keeps: {kept.describe()}; "
            f"sequences {from_seq}..{kept.first_seq - 1} are gone (max_age, max_bytes or "
            "deleted), so they cannot be re-delivered from the stream"
        )
    if since is not None and (kept.first_time is None or since < kept.first_time):
        raise RewindRefused(
            f"--since {since.isoformat()} is older than what {stream} keeps: "
            f"{kept.describe()}; what was stored before is gone (max_age, max_bytes or "
            "deleted), so it cannot be re-delivered from the stream"
        )


def durable_filters(topology: Topology, durable: str) -> list[str]:
    """The subjects the rewind reads: the durable's event filters, each widened to every
    partition on a partitioned stream (never its replay subject)."""
    spec = topology.durable(durable)
    stream = topology.stream_of(durable)
    filters = list(spec.filter_subjects)
    if stream.partitions > 1:
        namespace = topology.namespace_of_stream(spec.stream)
        filters = [all_partitions_filter(f, namespace) for f in filters]
    return list(dict.fromkeys(f for f in filters if not f.startswith(REPLAY_PREFIX + ".")))


# --------------------------------------------------------------------------- stream reads


async def _at_or_after(js: JetStream, stream: str, seq: int) -> Any | None:
    """The first stored message at or after ``seq`` (None: none)."""
    try:
        return await js.get_msg(stream, seq=max(seq, 1), next=True)
    except NOT_FOUND_ERRORS:
        return None


async def kept_of(js: JetStream, stream: str) -> Kept:
    """What ``stream`` keeps now."""
    try:
        info = await js.stream_info(stream)
    except NOT_FOUND_ERRORS:
        raise RewindRefused(f"stream {stream} does not exist (run `ferry provision`)") from None
    state = info.state
    first = int(state.first_seq)
    last = int(state.last_seq)
    if not state.messages:
        return Kept(first, last, None)
    msg = await _at_or_after(js, stream, first)
    return Kept(first, last, msg.time if msg is not None else None)


async def first_seq_at(js: JetStream, stream: str, kept: Kept, moment: datetime) -> int:
    """The first sequence stored at or after ``moment`` (``kept.last_seq + 1``: none), by a
    binary search on stored times (JetStream stamps messages in sequence order)."""
    low, high = kept.first_seq, kept.last_seq + 1
    while low < high:
        middle = (low + high) // 2
        msg = await _at_or_after(js, stream, middle)
        if msg is None or msg.seq > high - 1:
            high = middle
        elif msg.time >= moment:
            high = middle  # nothing is stored between middle and msg.seq
        else:
            low = int(msg.seq) + 1
    return low


async def next_match(js: JetStream, stream: str, filters: list[str], seq: int) -> int | None:
    """The first sequence at or after ``seq`` that one of ``filters`` takes (None: none)."""
    found = []
    for subject in filters:
        try:
            msg = await js.get_msg(stream, seq=max(seq, 1), subject=subject, next=True)
        except NOT_FOUND_ERRORS:
            continue
        if msg.seq is not None:
            found.append(int(msg.seq))
    return min(found, default=None)
