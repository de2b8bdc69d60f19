"""The bounded waits of shared.waits keep a cancellation that arrives just as the wait
ends (Python 3.11's asyncio.wait_for drops it: the reason these exist)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from shared.waits import cancel_and_wait, sleep_unless, wait_any, within


async def cancelled_as_it_ends(
    wait: Callable[[asyncio.Event], Awaitable[object]], turns_between: int
) -> tuple[int, bool]:
    """Run ``wait(event)`` in a loop, in a task; set the event, let the loop run
    ``turns_between`` times, and cancel the task: one of those is the turn in which the
    wait finishes. How many waits ran, and whether the task ended cancelled (rather than
    looping on)."""
    event = asyncio.Event()
    turns = 0

    async def loop() -> None:
        nonlocal turns
        while True:
            turns += 1
            await wait(event)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    event.set()
    for _ in range(turns_between):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=2.0)
    return turns, bool(done) and task.cancelled()


@pytest.mark.parametrize("turns_between", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "wait",
    [
        pytest.param(lambda event: sleep_unless(event, 30.0), id="sleep_unless"),
        pytest.param(lambda event: within(30.0, event.wait()), id="within"),
        pytest.param(lambda event: wait_any(event, timeout=30.0), id="wait_any"),
    ],
)
async def test_a_cancellation_arriving_as_the_wait_ends_is_kept(
    wait: Callable[[asyncio.Event], Awaitable[object]], turns_between: int
) -> None:
    turns, cancelled = await cancelled_as_it_ends(wait, turns_between)
    assert cancelled, f"the task went on after its cancellation ({turns} waits)"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 fixed asyncio.wait_for")
async def test_the_check_catches_asyncio_wait_for_dropping_the_cancellation() -> None:
    """The harness above can fail: on 3.11, wait_for loses the cancellation in one of
    those turns, and the task loops on."""
    outcomes = [
        await cancelled_as_it_ends(
            lambda event: asyncio.wait_for(event.wait(), 30.0),
            turns_between,
        )
        for turns_between in (0, 1, 2, 3)
    ]
    assert not all(cancelled for _, cancelled in outcomes), outcomes


async def test_sleep_unless_says_whether_stop_was_set() -> None:
    stop = asyncio.Event()
    assert await sleep_unless(stop, 0.01) is False
    assert await sleep_unless(stop, 0) is False
    assert await sleep_unless(stop, -1.0) is False
    asyncio.get_running_loop().call_later(0.01, stop.set)
    assert await sleep_unless(stop, 30.0) is True
    assert await sleep_unless(stop, 30.0) is True  # already set: at once


async def test_within_returns_the_result_or_raises_timeout_and_cancels_the_work() -> None:
    assert await within(1.0, asyncio.sleep(0, result="done")) == "done"
    assert await within(None, asyncio.sleep(0, result="no limit")) == "no limit"
    work = asyncio.ensure_future(asyncio.sleep(30))
    with pytest.raises(TimeoutError):
        await within(0.01, work)
    assert work.cancelled()


async def test_within_lets_the_works_own_error_through() -> None:
    async def broken() -> None:
        raise LookupError("inside")

    with pytest.raises(LookupError, match="inside"):
        await within(1.0, broken())


async def test_cancel_and_wait_stops_the_task_and_keeps_the_callers_cancellation() -> None:
    stopped = asyncio.Event()

    async def child() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.2)  # a slow clean-up: the caller is cancelled meanwhile
            stopped.set()

    task = asyncio.create_task(child())
    await asyncio.sleep(0)
    caller = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(stopped.wait(), 2.0)
    assert task.cancelled()


async def test_cancel_and_wait_absorbs_the_tasks_cancellation_raises_its_error() -> None:
    task = asyncio.create_task(asyncio.sleep(30))
    await asyncio.sleep(0)
    assert await cancel_and_wait(task) is True and task.cancelled()

    async def broken() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            raise LookupError("while stopping")

    failing = asyncio.create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(LookupError, match="while stopping"):
        await cancel_and_wait(failing)


async def test_cancel_and_wait_gives_up_after_its_timeout() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await release.wait()  # takes its time to stop

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task, 0.05) is False
    assert not task.done()
    release.set()
    await asyncio.wait({task}, timeout=2.0)
    assert task.done()
