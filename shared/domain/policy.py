"""Pure policy the adapters and the lint share: retry caps, publisher timing, replay rules.

Numbers and rules only, no I/O, so the contracts layer (the lint) can reason about them
without importing an adapter or the settings.

Phase 1 of issue 27: ``shared/adapters/outbox.py`` and ``shared/adapters/dead_letters.py``
still hold their own copies (other work was editing them); ``tests/unit/test_policy.py``
pins the copies equal until they import these instead.
"""

from __future__ import annotations

import random
from typing import Protocol

#: Longest back-off between attempts of one failing outbox row (the claim's SQL uses it).
ROW_RETRY_CAP_SECONDS = 60

#: An outbox-publisher's default seconds to wait for a PubAck before the row is retried.
PUBLISH_TIMEOUT = 5.0
#: Its default longest pause after a failed batch.
RETRY_MAX = 5.0
#: Its default polling fallback when no NOTIFY arrives.
POLL_INTERVAL = 1.0

#: Reasons that are defects of the message's own bytes: replaying the same bytes cannot
#: change the outcome, so even the automatic policy holds them for an operator.
NOT_REPLAYABLE = frozenset(
    {
        "MALFORMED_JSON",
        "MALFORMED_ENVELOPE",
        "MISSING_FIELD",
        "INVALID_FIELD",
        "INVALID_SUBJECT",
        "SUBJECT_MISMATCH",
        "DIGEST_MISMATCH",
        "SCHEMA_INVALID",
        "MESSAGE_TOO_LARGE",
    }
)

#: Statuses an operator may replay from, and those that are final.
REPLAYABLE_STATUSES = ("dead", "held", "parked")
FINAL_STATUSES = ("replayed", "discarded")


class ReplayBackoff(Protocol):
    """The back-off part of a durable's replay limits (``ReplayLimits`` in the topology)."""

    @property
    def base_delay(self) -> float: ...
    @property
    def max_delay(self) -> float: ...


def replay_delay(
    limits: ReplayBackoff, replay_attempts: int, rng: random.Random | None = None
) -> float:
    """Full-jitter exponential back-off before replay number ``replay_attempts + 1``."""
    ceiling = min(limits.max_delay, limits.base_delay * 2.0**replay_attempts)
    return (rng or random).uniform(0.0, ceiling)


def initial_status(
    *, replay: str, max_attempts: int, reason_code: str, replay_attempts: int
) -> str:
    """Where a new (or again) dead letter starts: dead (auto-replay), held, or parked.

    ``replay`` is the durable's policy (``automatic`` or ``operator``), ``max_attempts``
    its replay cap.
    """
    if replay != "automatic" or reason_code in NOT_REPLAYABLE:
        return "held"
    if replay_attempts >= max_attempts:
        return "parked"
    return "dead"
