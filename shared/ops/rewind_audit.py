"""The audit of a rewind (``ferry durable rewind``, :mod:`shared.ops.rewind`): its row in
``durable_rewinds`` (migration 0011) in the durable's target database, written when it
starts and completed when it ends, and the :class:`Tally` of what it selected and published."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field

from shared.adapters.postgres import Conn

START = """
INSERT INTO durable_rewinds (id, durable, stream, since, from_seq, until, until_seq, stop_seq,
                             dry_run, actor, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
"""

_FINISH = """
UPDATE durable_rewinds
SET first_seq = $2, last_seq = $3, selected = $4, published = $5, skipped = $6,
    by_subject = $7::jsonb, outcome = $8, error = $9, finished_at = clock_timestamp()
WHERE id = $1
"""


@dataclass
class Tally:
    """What a rewind selected and published so far (its audit row's counts)."""

    first_seq: int | None = None
    last_seq: int | None = None
    selected: int = 0
    published: int = 0
    skipped: int = 0
    by_subject: Counter[str] = field(default_factory=Counter)

    def seen(self, seq: int, subject: str) -> None:
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq
        self.selected += 1
        self.by_subject[subject] += 1


async def finish(
    conn: Conn, rewind_id: uuid.UUID, tally: Tally, outcome: str, error: str | None
) -> None:
    await conn.execute(
        _FINISH,
        rewind_id,
        tally.first_seq,
        tally.last_seq,
        tally.selected,
        tally.published,
        tally.skipped,
        json.dumps(dict(sorted(tally.by_subject.items()))),
        outcome,
        error,
    )
