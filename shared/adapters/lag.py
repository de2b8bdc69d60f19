"""How far behind a durable is in time: the age of the oldest message of its stream it
has not been delivered yet (the consumer's ``ferry_consumer_lag_seconds`` and the
console's overview read it the same way)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from nats.errors import Error as NatsError


async def oldest_undelivered_age(js: Any, info: Any) -> float:
    """Seconds since the first message after the consumer's last delivered one was stored
    (0 when there is none). ``info`` is the consumer's info; each of its filter subjects
    is asked once. A subject whose message cannot be read now (gone, or NATS too slow to
    answer) is left out rather than failing the whole reading."""
    config = info.config
    filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
    start = (info.delivered.stream_seq if info.delivered else 0) + 1
    oldest: datetime | None = None
    for subject in filters:
        try:
            msg = await js.get_msg(info.stream_name, seq=start, subject=subject, next=True)
        except (NatsError, TimeoutError):
            continue
        stamp = stored_at(msg)
        if stamp is not None and (oldest is None or stamp < oldest):
            oldest = stamp
    if oldest is None:
        return 0.0
    return max((datetime.now(UTC) - oldest).total_seconds(), 0.0)


def stored_at(msg: Any) -> datetime | None:
    """When JetStream stored ``msg`` (timezone-aware), or None when it does not say."""
    stamp = getattr(msg, "time", None)
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")[:26] + "+00:00")
        except ValueError:
            return None
    return None
