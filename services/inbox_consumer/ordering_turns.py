"""Per-key FIFO turns of an ``ordering: key`` durable: :class:`KeyTurns` and its
:class:`Turn` (see :mod:`services.inbox_consumer.ordering`)."""

from __future__ import annotations

import asyncio
from types import TracebackType


class KeyTurns:
    """Per-key FIFO turns: a turn starts when the key's previous turn has ended."""

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        return len(self._tails)

    def take(self, key: str) -> Turn:
        """Queue for ``key`` now (no await: call in the order the work arrived)."""
        previous = self._tails.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tails[key] = mine
        return Turn(self, key, previous, mine)

    def _ended(self, key: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._tails.get(key) is mine:
            del self._tails[key]


class Turn:
    """One place in a key's queue; ``async with`` waits for it and ends it."""

    def __init__(
        self,
        turns: KeyTurns,
        key: str,
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        self.turns, self.key, self.previous, self.mine = turns, key, previous, mine

    async def __aenter__(self) -> Turn:
        if self.previous is not None and not self.previous.done():
            try:
                await asyncio.shield(self.previous)
            except asyncio.CancelledError:
                self.abandon()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.turns._ended(self.key, self.mine)

    def abandon(self) -> None:
        """Give up the turn without taking it: it ends when the previous one ends, so the
        next in line still never overtakes the previous."""
        if self.previous is None or self.previous.done():
            self.turns._ended(self.key, self.mine)
        else:
            self.previous.add_done_callback(lambda _: self.turns._ended(self.key, self.mine))
