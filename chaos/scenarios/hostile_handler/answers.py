"""What the hostile fronts' logs say (:mod:`chaos.scenarios.hostile_handler.front`): their
answers counted, and the dead letters those answers do not explain."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from chaos.engine.settled import Settled
from chaos.engine.workload import Ledger
from chaos.engine.world import World
from chaos.scenarios.hostile_handler.front import read_log


def count_hostile_answers(logs: list[Path], faults: Counter[str]) -> None:
    """Count the hostile fronts' answers (calls, not events: a batch call's events share
    one answer) by status, Retry-After kind, body kind, action; and the batch calls."""
    for path in logs:
        for answer in read_log(path):
            if answer.get("index", 0) != 0:
                continue  # a later event of a batch call: its answer is counted once
            size = int(answer.get("batch", 1))
            if size > 1:
                faults["batch calls"] += 1
                faults["events in batch calls"] += size
            action = answer.get("action", "?")
            if action == "status":
                faults[f"answered {answer.get('status')}"] += 1
                faults[f"Retry-After {answer.get('retry_after')}"] += 1
                faults[f"body {answer.get('body')}"] += 1
            elif action != "pass":
                faults[f"{action} (after the real handler answered)"] += 1
            else:
                faults["passed through"] += 1


def _tallies(path: Path) -> dict[str, Counter[str]]:
    """message id -> answers by status, and ``failed`` (answers that spend a delivery).

    The log has one line per event, a batch call's too, with the status that event got
    (its own result when the call passed, ``missing`` when the answer had none for it)."""
    answers: dict[str, Counter[str]] = {}
    for answer in read_log(path):
        tally = answers.setdefault(str(answer.get("message_id")), Counter())
        status = answer.get("status")
        tally[str(status)] += 1
        spoiled = answer.get("action") in ("reset", "trickle", "replaced")
        if spoiled or status not in (200, 401, 403, 409):
            tally["failed"] += 1
    return answers


def dead_letters_without_cause(
    world: World, logs: dict[str, Path], ledger: Ledger, settled: Settled
) -> list[str]:
    """Dead letters of a fronted durable that its hostile handler's answers do not explain.

    HANDLER_BAD_REQUEST needs a 413 for that message, HANDLER_REJECTED a 422, any
    exhaustion at least half of ``max_deliver`` failed answers (401/403 holds spend none).
    """
    out = []
    for durable, path in sorted(logs.items()):
        answers = _tallies(path)
        floor = world.topo.durables[durable].max_deliver // 2
        for intent in ledger.intents.values():
            fate = settled.fate.get(intent.id, "")
            if intent.durable != durable or not fate.startswith("dead_letter:"):
                continue
            reason, tally = fate.split(":", 1)[1], answers.get(intent.id, Counter())
            explained = {
                "HANDLER_BAD_REQUEST": tally["413"] > 0,
                "HANDLER_REJECTED": tally["422"] > 0,
            }.get(reason, tally["failed"] >= floor)
            if not explained:
                out.append(f"{intent.id} ({reason}; answers {dict(tally)})")
    return out
