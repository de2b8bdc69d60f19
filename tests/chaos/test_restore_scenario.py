"""The restore drill (issue 26) at CI size: a context's database backed up while the
workload runs, restored later, the durable targeting it rewound with ``ferry durable
rewind``, the restored outbox publishing again (:mod:`chaos.scenarios.restore.play`).

What an operator relies on after a restore: nothing the restored database should know
about is lost (every event the consuming side had settled after the backup is settled
again), no effect is applied twice, what the inbox already had is counted as a duplicate,
and on the producing side only the events committed after the backup are forgotten (those
already published reached the consumer anyway), the others re-published and dropped by
the duplicate window or the downstream inbox. ``python -m chaos.run --scenario restore
--seed S`` runs it again by hand (``--schedule soak`` for the long version).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from chaos.engine.tuning import chaos_topology_doc
from chaos.scenarios.restore.setup import RESTORED, margin_of, restore_tuning
from shared.contracts.lint import redelivery_horizon, require_clean_topology
from shared.contracts.loading import load_topology
from tests.chaos.conftest import told_scenario

SEED = int(os.environ.get("FERRY_CHAOS_SEED", "20261126"))
CONSUMING = "sea__from_vibespro"


def test_the_drill_world_passes_the_lint_and_keeps_the_margin_short(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(chaos_topology_doc(restore_tuning())))
    topo = load_topology(path)
    require_clean_topology(topo, source=path)
    assert [n for n, d in topo.durables.items() if d.target == RESTORED] == [CONSUMING]
    # The rewind starts a redelivery horizon before the backup: short clocks keep it well
    # inside the CI run's first half (the backup is 20 s in).
    assert redelivery_horizon(topo.durables[CONSUMING]) < margin_of(topo.durables[CONSUMING]) < 20


@pytest.mark.integration
async def test_a_restore_loses_nothing_it_should_know_and_applies_nothing_twice(
    tmp_path: Path,
) -> None:
    result, table, story = await told_scenario(tmp_path / "run", "restore", SEED)
    settled = result.settled
    row = f"{CONSUMING}: "

    # The drill happened: a backup, a restore, the rewind through the command.
    faults = result.faults
    assert faults["backup (pg_dump -Fc)"] == 1, story
    assert faults["restore (drop, create, pg_restore)"] == 1, story
    assert faults["rewind (ferry durable rewind)"] == 1, story
    # Scenario invariants over what the databases know: drained, nothing stuck or lost,
    # no effect twice, no role exiting by itself.
    assert result.drained, story
    assert settled.stuck == [] and settled.lost == [], story
    assert settled.effects_twice == [] and result.unexpected_exits == [], story

    # Producing side: only events committed after the backup are forgotten; those already
    # published reached the consumer anyway; rows unpublished at the backup and published
    # after it were re-published by the restored outbox and caught (CI: inside the window).
    assert table["before the backup, missing after the restore"] == 0, story
    assert table[f"{RESTORED} events before the backup (kept)"] > 0, story
    forgotten = table[f"{RESTORED} events after the backup (forgotten)"]
    assert forgotten > 0, story
    reached = table["  forgotten, processed downstream anyway"]
    assert reached == table["  forgotten, already published"], story
    republished = table["unpublished at the backup, published after"]
    assert republished > 0, story
    caught = table["  caught by the duplicate window"] + table["  caught by the downstream inbox"]
    assert caught == republished, story
    assert settled.committed + forgotten >= 0.95 * 450, story

    # Consuming side: what it settled after the backup was forgotten, re-delivered by the
    # rewind and settled again, each effect once; what it still had counted as duplicates.
    assert table[row + "settled after it (forgotten)"] > 0, story
    assert table[row + "effects forgotten by the restore"] > 0, story
    assert table[row + "lost"] == 0 and table[row + "effects applied twice"] == 0, story
    forgotten_settled = table[row + "settled after it (forgotten)"]
    assert table[row + "forgotten, settled again"] == forgotten_settled, story
    selected, published = (int(n) for n in table[row + "rewind selected, published"].split(","))
    assert published == selected >= forgotten_settled, story
    # The copy of every event the restored inbox had processed is a duplicate, counted on
    # that event; only the forgotten ones are processed again. (The range's other events,
    # not processed at the restore, are processed once by the copy or the original.)
    rewound_processed = table[row + "rewound, processed at the restore"]
    assert rewound_processed > 0, story
    assert table[row + "  their copy not counted as a duplicate"] == 0, story
    assert table[row + "duplicates caught by the inbox"] >= rewound_processed, story
    margin = margin_of(load_topology(tmp_path / "run" / "topology.yaml").durables[CONSUMING])
    assert f"({margin})" in table[row + "rewind since (margin s)"], story
    assert result.violations == [], story
