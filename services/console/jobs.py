"""Bulk replays started from the console: paced, watched, cancellable.

A job replays its entries one after another through
:func:`shared.ops.dlq_change.replay_dead_letter` — the function ``ferry dlq replay`` runs, so
each replay is audited in ``dead_letter_actions`` with who and why — at most ``rate`` per
second. Cancelling stops it between two replays (a replay is never cut in half); what was
replayed stays replayed. Jobs live in the console's memory: a restart forgets the job,
never a replay (those are in the database).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared.adapters import dead_letters as store
from shared.domain.errors import ConfigurationError, TransientError
from shared.waits import sleep_unless

log = logging.getLogger("ferry.console.jobs")

#: Replays one entry: (durable, message id) → the subject it went out on.
ReplayOne = Callable[[dict[str, Any]], Awaitable[str]]
#: Jobs kept for the page (oldest forgotten first).
KEEP = 50


@dataclass
class Job:
    """One bulk replay."""

    id: int
    actor: str
    reason: str
    title: str
    entries: list[dict[str, Any]]
    rate: float
    state: str = "running"  # running | cancelling | cancelled | done
    started: float = field(default_factory=time.time)
    finished: float | None = None
    replayed: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None
    #: Set by a cancel: wakes the pause between two replays at once.
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done_count(self) -> int:
        """Entries handled so far (replayed or refused)."""
        return len(self.replayed) + len(self.refused)

    @property
    def total(self) -> int:
        """Entries of the job."""
        return len(self.entries)

    def stopping(self) -> bool:
        """Whether a cancel was asked for (read between two replays)."""
        return self.cancel_requested

    @property
    def running(self) -> bool:
        """Whether it still works."""
        return self.state in ("running", "cancelling")


class Jobs:
    """The console's bulk replays."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.jobs: dict[int, Job] = {}

    def start(
        self,
        entries: list[dict[str, Any]],
        *,
        actor: str,
        reason: str,
        rate: float,
        title: str,
        replay_one: ReplayOne,
    ) -> Job:
        """Start replaying ``entries`` in the background; the job."""
        job = Job(next(self._ids), actor, reason, title, entries, rate)
        job.task = asyncio.ensure_future(self._run(job, replay_one))
        self.jobs[job.id] = job
        for old in sorted(self.jobs)[:-KEEP]:
            if not self.jobs[old].running:
                del self.jobs[old]
        return job

    def cancel(self, job_id: int) -> Job | None:
        """Ask a job to stop after the replay in hand; the job (None when unknown)."""
        job = self.jobs.get(job_id)
        if job is not None and job.running:
            job.cancel_requested = True
            job.state = "cancelling"
            job.cancelled.set()
        return job

    async def _run(self, job: Job, replay_one: ReplayOne) -> None:
        try:
            for index, entry in enumerate(job.entries):
                if job.stopping():
                    job.state = "cancelled"
                    return
                if index:
                    await sleep_unless(job.cancelled, 1.0 / job.rate)
                    if job.stopping():
                        job.state = "cancelled"
                        return
                key = f"{entry['durable']}/{entry['message_id']}"
                try:
                    await replay_one(entry)
                    job.replayed.append(key)
                except store.NotReplayable as exc:
                    job.refused.append((key, str(exc)))
                except (TransientError, ConfigurationError, OSError, TimeoutError) as exc:
                    job.refused.append((key, f"not replayed now: {exc}"))
                except Exception as exc:  # one entry never ends the job or the console
                    log.exception("replay of %s failed", key)
                    job.refused.append((key, f"unexpected error ({type(exc).__name__})"))
            job.state = "done"
        finally:
            job.finished = time.time()
            log.info(
                "bulk replay %s %s: %s replayed, %s refused",
                job.id,
                job.state,
                len(job.replayed),
                len(job.refused),
                extra={"actor": job.actor},
            )

    async def stop(self, deadline: float) -> None:
        """Cancel every running job and wait for them (console shutdown)."""
        running = [j for j in self.jobs.values() if j.running and j.task is not None]
        for job in running:
            job.cancel_requested = True
            job.cancelled.set()
        tasks = [j.task for j in running if j.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=deadline)


def new_message_id(text: str) -> uuid.UUID:
    """A message id from a form; ValueError naming the value otherwise."""
    try:
        return uuid.UUID(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a message id (UUID)") from None
