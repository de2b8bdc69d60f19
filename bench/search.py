"""The highest sustained rate: which offered loads to try, given what each step said.

Pure logic over a ``step(rate) -> why it failed ('' when it held)`` callable, so Ferry's
search and the bare-bones pipeline's are the same search, and it is tested without
servers (``tests/bench/test_search.py``):

1. upwards from ``start`` by ``increment`` until a step fails (or ``ceiling``);
2. if the very first fails, downwards by halves (to ``floor``) until one holds;
3. then bisection between the highest rate that held and the lowest that failed, until
   they are at most an eighth of the held rate apart (50 msg/s at least).

A step that fails only on latency (its producer kept up) is run once more before it counts
as failed: on a shared 2-core machine one step's p99 can be a backlog left by the step
before, and a single unlucky step used to decide the figure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: ``step(rate)``: run one fixed-rate step, return why it failed ('' when it held).
Step = Callable[[int], Awaitable[str]]
#: Words of a verdict that blame the producer (the machine's ceiling), not the latency.
PRODUCER_SHORT = "producer achieved"


@dataclass
class Search:
    """Where the search ended: the highest rate that held and the lowest that failed."""

    passed: int | None = None
    failed: tuple[int, str] | None = None
    #: Every step run, in order: (rate, verdict).
    steps: list[tuple[int, str]] = field(default_factory=list)


def _round(rate: int) -> int:
    return rate // 50 * 50


async def search_sustained(
    step: Step, *, start: int, increment: int, ceiling: int, floor: int = 100
) -> Search:
    """The search described in the module's docstring."""
    searching = _Searching(step)
    await searching.up(start, increment, ceiling)
    await searching.down(floor)
    await searching.bisect()
    return searching.found


class _Searching:
    def __init__(self, step: Step) -> None:
        self.step, self.found = step, Search()

    async def judged(self, rate: int) -> str:
        """The step's verdict; a failure on latency alone is run once more."""
        verdict = await self.step(rate)
        self.found.steps.append((rate, verdict))
        if verdict and PRODUCER_SHORT not in verdict:
            verdict = await self.step(rate)
            self.found.steps.append((rate, verdict))
        return verdict

    async def up(self, start: int, increment: int, ceiling: int) -> None:
        rate = start
        while rate <= ceiling:
            verdict = await self.judged(rate)
            if verdict:
                self.found.failed = (rate, verdict)
                return
            self.found.passed = rate
            rate += increment

    async def down(self, floor: int) -> None:
        """Only when the very first step failed: halve until one holds."""
        found = self.found
        if found.passed is not None or found.failed is None:
            return
        rate = _round(found.failed[0] // 2)
        while rate >= floor:
            verdict = await self.judged(rate)
            if not verdict:
                found.passed = rate
                return
            found.failed = (rate, verdict)
            rate = _round(rate // 2)

    async def bisect(self) -> None:
        found = self.found
        while found.passed is not None and found.failed is not None:
            if found.failed[0] - found.passed <= max(found.passed // 8, 50):
                return
            middle = _round((found.passed + found.failed[0]) // 2)
            if middle <= found.passed:
                return
            verdict = await self.judged(middle)
            if verdict:
                found.failed = (middle, verdict)
            else:
                found.passed = middle
