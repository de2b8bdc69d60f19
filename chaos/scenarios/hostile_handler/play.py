"""The ``hostile-handler`` scenario (ISSUE 22): ``python -m chaos.run --scenario
hostile-handler [--schedule soak]``.

A hostile front (:mod:`chaos.scenarios.hostile_handler.front`) before each handler: random
401/403/408/413/429/5xx, Retry-After of every kind, non-UTF-8 and huge bodies, trickled
answers, resets mid-body. Afterwards its answers are counted and every dead letter must be
explained by them (:mod:`chaos.scenarios.hostile_handler.answers`).
"""

from __future__ import annotations

from pathlib import Path

from chaos.engine.config import RunConfig, Size
from chaos.engine.scenario import Play
from chaos.engine.settled import Settled
from chaos.engine.tuning import Tuning, short_clocks
from chaos.scenarios.hostile_handler.answers import (
    count_hostile_answers,
    dead_letters_without_cause,
)

#: The durables a front stands before.
FRONTED = ("sea__from_vibespro", "vibespro__from_sea")


def hostile_log(run_dir: Path, durable: str) -> Path:
    """Where the hostile front of ``durable`` logs its answers."""
    return run_dir / f"hostile-{durable}.jsonl"


class HostileHandler(Play):
    """The hostile handler (see the module docstring)."""

    sizes = {"ci": Size(35.0, 300, 75.0), "soak": Size(600.0, 20_000, 400.0)}

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """A front before each handler; the consumer's waits on Retry-After and auth capped."""
        clocks = short_clocks("6s", 10, ["200ms", "500ms", "1s", "2s"])
        fronts = {
            d: [
                "-m",
                "chaos.scenarios.hostile_handler.front",
                "--seed",
                str(config.seed),
                "--log",
                str(hostile_log(config.run_dir, d)),
            ]
            for d in FRONTED
        }
        consumer = {
            "FERRY_RETRY_AFTER_CAP": "2",
            "FERRY_AUTH_RETRY_INITIAL": "0.2",
            "FERRY_AUTH_RETRY_MAX": "1",
        }
        return Tuning(clocks=clocks, settings={"consumer": consumer}, fronts=fronts)

    def after_stop(self, settled: Settled) -> list[str]:
        """The fronts' answers counted; the dead letters they do not explain."""
        run = self.run
        logs = {d: hostile_log(run.config.run_dir, d) for d in sorted(run.world.tuning.fronts)}
        count_hostile_answers(list(logs.values()), run.faults)
        return dead_letters_without_cause(run.world, logs, run.ledger, settled)
