"""The ``hostile-payloads`` scenario (ISSUE 22): ``python -m chaos.run --scenario
hostile-payloads [--schedule soak]``.

Plain-SQL INSERTs (:mod:`chaos.scenarios.hostile_payloads.cases`) at and around every size
limit, deep nesting, huge numbers, NUL bytes, lone surrogates, beside an ordinary workload.
An INSERT PostgreSQL refuses is counted *refused at the source*; a valid event within every
limit must be processed.
"""

from __future__ import annotations

from chaos.engine.config import RunConfig, Size
from chaos.engine.scenario import Play
from chaos.engine.tuning import DURABLE_CLOCKS, PUBLISHER_COMPRESSED, Tuning
from chaos.scenarios.hostile_payloads import cases


class HostilePayloads(Play):
    """The hostile payloads (see the module docstring)."""

    sizes = {"ci": Size(25.0, 120, 75.0), "soak": Size(300.0, 5_000, 400.0, rounds=5)}

    @classmethod
    def tuning(cls, config: RunConfig) -> Tuning:
        """The ordinary durable clocks, the publisher compressed."""
        return Tuning(
            clocks=dict(DURABLE_CLOCKS), settings={"publisher": dict(PUBLISHER_COMPRESSED)}
        )

    async def during(self, begin: float) -> None:
        """Insert every case (and a train of followers), counting each family."""
        run = self.run
        catalogue = cases.catalogue(rounds=run.size.rounds) + cases.train(followers=105)
        outcomes = await cases.insert_all(
            run.world.direct_dsn(cases.CONTEXT), catalogue, run.ledger, run.config.seed
        )
        for outcome in outcomes:
            family = outcome.case.name.split("#")[0]
            family = "train-follower" if family.startswith("train-follower") else family
            run.faults[f"payload {family}"] += 1
            if outcome.refused:
                why = " ".join(outcome.refused.split())
                run.notes.append(f"refused at the source: {outcome.case.name}: {why}")
            elif outcome.case.expect == "processed":
                run.must_process.add(outcome.intent.id)
