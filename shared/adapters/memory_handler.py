"""The in-memory :class:`~shared.domain.ports.HandlerPort`: answers from a script per
message id (or a default), records every call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from shared.domain.ack import HandlerResponse, Outcome
from shared.domain.ports import BatchOutcome, HandlerPort

# --- event handler --------------------------------------------------------------------

OK = HandlerResponse(200)


@dataclass
class ScriptedHandler(HandlerPort):
    """:class:`~shared.domain.ports.HandlerPort` answering from ``script`` (per message id,
    in order; the ``Idempotency-Key`` header names it), else ``default``; never raises.

    A batch call answers from the script of its ``Idempotency-Key`` too, else
    ``batch_default`` (or ``default``: one outcome for every event of the call).
    """

    script: dict[str, list[Outcome]] = field(default_factory=dict)
    default: Outcome = OK
    batch_default: BatchOutcome | None = None
    calls: list[str] = field(default_factory=list)
    batches: list[list[UUID]] = field(default_factory=list)
    closed: bool = False

    async def handle(self, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
        mid = headers.get("Idempotency-Key", "")
        self.calls.append(mid)
        answers = self.script.get(mid)
        return answers.pop(0) if answers else self.default

    async def handle_batch(
        self, body: dict[str, Any], headers: dict[str, str], expected: list[UUID]
    ) -> BatchOutcome:
        self.batches.append(list(expected))
        answers = self.script.get(headers.get("Idempotency-Key", ""))
        if answers:
            return answers.pop(0)
        return self.batch_default if self.batch_default is not None else self.default

    async def close(self) -> None:
        self.closed = True
