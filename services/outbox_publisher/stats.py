"""The publisher's counters (the role exposes them; tests read them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PublisherStats:
    """Counters the role exposes (and tests read)."""

    published: int = 0
    duplicates: int = 0
    publish_errors: int = 0
    #: Rows this process set aside, and batches that raised something unexpected.
    set_aside: int = 0
    batch_errors: int = 0
    batches: int = 0
    #: Claims that found rows held back behind another worker's batch, and waits for such
    #: rows that another worker's commit ended (rather than the poll).
    held_back: int = 0
    released: int = 0
    #: Atomic batches stored whole, and refused (their rows then went one by one).
    atomic_batches: int = 0
    atomic_refused: int = 0
    last_db_ok: bool = False
    errors_by_kind: dict[str, int] = field(default_factory=dict)
