"""The failure groups' counts (migration 0027): kept by triggers on ``dead_letters`` as
changes, folded into ``dead_letter_groups`` here.

Every statement that inserts, deletes or moves dead letters between (durable, reason,
fingerprint, status) records its change; the console's Failures page reads the counts
plus the pending changes in one snapshot, so a fold changes no figure it shows: folding
keeps what the page reads small. The dlq-replayer folds at every scan.
"""

from __future__ import annotations

from shared.adapters.postgres import Conn

_FOLD = "SELECT ferry_fold_dead_letter_groups()"


async def fold_groups(conn: Conn) -> int:
    """Fold the pending changes into the counts; how many change rows were folded."""
    return int(await conn.fetchval(_FOLD) or 0)
