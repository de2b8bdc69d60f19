"""The consumer's counters: what the role exposes (``/metrics``) and tests read."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.adapters.jetstream_answers import AnswerStats


@dataclass
class ConsumerStats:
    """Counters the role exposes (and tests read)."""

    fetched: int = 0
    processed: int = 0
    duplicates: int = 0
    retries: int = 0
    dead_lettered: int = 0
    exhausted: int = 0
    handler_calls: int = 0
    contended: int = 0
    auth_refusals: int = 0
    inbox_unavailable: int = 0
    consumer_errors: int = 0
    alerts: int = 0
    #: ``ordering: key``: messages parked behind a failed event of their key, and parked
    #: messages settled from the park (processed, dead-lettered and skipped, duplicates).
    parked: int = 0
    released: int = 0
    #: ``ordering: key``: jumps in a partition's consumer sequence (deliveries lost in
    #: transit), each a restart of the partition once they are redeliverable.
    delivery_gaps: int = 0
    bound: bool = False
    retries_by_reason: dict[str, int] = field(default_factory=dict)
    #: Naks and terms confirmed late or never, acks re-sent (every partition's loop).
    answers: AnswerStats = field(default_factory=AnswerStats)
