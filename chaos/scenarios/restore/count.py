"""The count of the restore drill (:mod:`chaos.scenarios.restore.play`): :class:`RestoreCount`,
which the drill's play holds, builds after the drain the results table, lists the forgotten
events in ``forgotten.json`` and names the violations.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.engine.accounting import read_stream
from chaos.engine.results import as_json, write_file
from chaos.engine.scenario import ScenarioRun
from chaos.engine.settled import Settled, read_inbox
from chaos.scenarios.restore.db import duplicates
from chaos.scenarios.restore.setup import FINAL, RESTORED, Drill, consuming, downstream


class RestoreCount:
    """The restore drill's count, once drained: handed the run and the drill's record."""

    def __init__(self, run: ScenarioRun, drill: Drill) -> None:
        self.run, self.drill, self.world = run, drill, run.world
        self.js = run.engine.nc.jetstream() if run.engine.nc is not None else None
        self.consuming, self.downstream = consuming(run.world), downstream(run.world)

    def _dsn(self, context: str) -> str:
        return self.world.direct_dsn(context)

    # -- the count ----------------------------------------------------------------------

    async def count(self, settled: Settled) -> tuple[dict[str, Any], list[str]]:
        """The drill's rows of the table and its broken invariants."""
        drill, topo, violations = self.drill, self.world.topo, list(self.drill.rewind_errors)
        origin = self.run.timeline.origin
        stream = topo.contexts[RESTORED].stream
        assert stream is not None and self.run.engine.nc is not None
        copies = Counter(
            i for i, _ in await read_stream(self.run.engine.nc.jetstream(), stream.name)
        )
        by_window = {i for i in drill.republished if copies[i] == 1}
        by_inbox = {i for i in drill.republished if copies[i] > 1}
        downstream_dupes = 0
        for durable in self.downstream:
            now = await duplicates(
                self._dsn(topo.durables[durable].target), durable, drill.republished
            )
            before = drill.downstream_duplicates_before.get(durable, {})
            downstream_dupes += sum(n - before.get(i, 0) for i, n in now.items())
        downstream: dict[str, str] = {}
        for durable in self.downstream:
            statuses, _, _ = await read_inbox(self._dsn(topo.durables[durable].target), durable)
            downstream.update((i, statuses[i]) for i in drill.forgotten if i in statuses)
        reached = sum(1 for i in drill.forgotten_published if downstream.get(i) in FINAL)
        self._list_forgotten(downstream)
        after = {i.id for i in self.run.ledger.intents.values()
                 if i.context == RESTORED and i.status == "committed"} - drill.kept  # fmt: skip
        table: dict[str, Any] = {
            "restored context": RESTORED,
            "backup at (s into the run)": round(drill.backup_at - origin, 1),
            "backup size (bytes), seconds": f"{drill.backup_bytes:,}, {drill.backup_seconds:.1f}",
            "restore at (s into the run)": round(drill.restore_at - origin, 1),
            "restore took (s, roles down)": round(drill.restore_seconds, 1),
            f"{RESTORED} events before the backup (kept)": len(drill.kept),
            f"{RESTORED} events after the backup (forgotten)": len(drill.forgotten),
            "  forgotten, listed in": "forgotten.json",
            "  forgotten, already published": len(drill.forgotten_published),
            "  forgotten, processed downstream anyway": reached,
            f"{RESTORED} events after the restore": len(after),
            "before the backup, missing after the restore": len(drill.missing),
            "unpublished at the backup, published after": len(drill.republished),
            "  caught by the duplicate window": len(by_window),
            "  caught by the downstream inbox": len(by_inbox),
            "  duplicates the downstream inboxes counted": downstream_dupes,
            "unpublished at the backup, published later": len(drill.unpublished_kept),
        }
        if drill.missing:
            violations.append(
                f"committed before the backup, missing from the restored database:"
                f" {len(drill.missing)} ({', '.join(drill.missing[:4])})"
            )
        if by_inbox and downstream_dupes < len(by_inbox):
            violations.append(
                f"re-published outside the duplicate window: {len(by_inbox)}, but the"
                f" downstream inboxes counted only {downstream_dupes} duplicates"
            )
        for durable in self.consuming:
            await self._count_consuming(durable, settled, table, violations)
        return table, violations

    def _list_forgotten(self, downstream: dict[str, str]) -> None:
        """``forgotten.json``: each event the restore forgot, when it was committed (seconds
        into the run), whether it had been published, its downstream inbox status."""
        forgotten = [self.run.ledger.intents[i] for i in self.drill.forgotten]
        doc = [
            {
                "id": i.id,
                "event": f"{i.event_type}.v{i.version}",
                "class": i.klass,
                "committed": round((i.committed_at or 0.0) - self.run.timeline.origin, 3),
                "published": i.id in self.drill.forgotten_published,
                "downstream": downstream.get(i.id),
            }
            for i in sorted(forgotten, key=lambda i: i.committed_at or 0.0)
        ]
        write_file(self.run.config.run_dir, "forgotten.json", as_json(doc, indent=1))

    async def _count_consuming(
        self, durable: str, settled: Settled, table: dict[str, Any], violations: list[str]
    ) -> None:
        drill = self.drill
        statuses, _, dupes = await read_inbox(self._dsn(RESTORED), durable)
        forgotten = drill.settled_forgotten.get(durable, set())
        unsettled = sorted(i for i in forgotten if statuses.get(i) not in FINAL)
        twice = [e for e in settled.effects_twice if e.split(" ")[0] in forgotten]
        doc = drill.rewinds.get(durable, {})
        result = doc.get("result", {})
        table[f"{durable}: settled before the backup (kept)"] = len(
            drill.settled_kept.get(durable, ())
        )
        table[f"{durable}: settled after it (forgotten)"] = len(forgotten)
        table[f"{durable}: effects forgotten by the restore"] = drill.effects_forgotten.get(
            durable, 0
        )
        table[f"{durable}: forgotten, settled again"] = len(forgotten) - len(unsettled)
        table[f"{durable}: lost"] = len(unsettled)
        table[f"{durable}: effects applied twice"] = len(twice)
        caught = dupes - drill.inbox_duplicates_before.get(durable, 0)
        table[f"{durable}: duplicates caught by the inbox"] = caught
        rewound, uncounted = await self._rewound_processed(durable, result)
        table[f"{durable}: rewound, processed at the restore"] = len(rewound)
        table[f"{durable}:   their copy not counted as a duplicate"] = len(uncounted)
        table[f"{durable}: rewind since (margin s)"] = (
            f"{doc.get('since', '-')} ({doc.get('margin', '-')})"
        )
        table[f"{durable}: rewind selected, published"] = (
            f"{result.get('selected', '-')}, {result.get('published', '-')}"
        )
        table[f"{durable}: rewind seconds, rate (msg/s)"] = (
            f"{result.get('seconds', '-')}, {result.get('rate', '-')}"
        )
        if not result:
            violations.append(f"{durable}: the rewind did not run (see the notes)")
        elif result.get("published") != result.get("selected", 0) - result.get("skipped", 0):
            violations.append(f"{durable}: the rewind published {result.get('published')} of"
                              f" {result.get('selected')} selected")  # fmt: skip
        if unsettled:
            violations.append(
                f"{durable}: settled after the backup, not again after the rewind:"
                f" {len(unsettled)} ({', '.join(unsettled[:4])})"
            )
        if uncounted:
            violations.append(
                f"{durable}: processed in the restored inbox and rewound, but no duplicate"
                f" counted on: {len(uncounted)} ({', '.join(uncounted[:4])})"
            )

    async def _rewound_processed(
        self, durable: str, result: dict[str, Any]
    ) -> tuple[set[str], list[str]]:
        """The events the rewind of ``durable`` re-delivered that the restored inbox had
        processed, and those of them whose copy the inbox did not count as a duplicate.

        Each must be counted: its row is final, so its copy cannot be processed (and a
        processed event had an envelope, so the rewind never skips it). The other events
        of the range were not processed at the restore (never delivered, retrying,
        dead-lettered, forgotten): the copy or the original may be the one processed, an
        original that ran out of deliveries leaves no duplicate to count, and a malformed
        one is not re-delivered at all, so none is required of them.
        """
        first, last = result.get("first_seq"), result.get("last_seq")
        if first is None or last is None or self.js is None:
            return set(), []
        stream = self.world.topo.durables[durable].stream
        in_range = {i for i, _ in await read_stream(self.js, stream, (first, last))}
        before = self.drill.processed_duplicates_before.get(durable, {})
        rewound = in_range & set(before)
        now = await duplicates(self._dsn(RESTORED), durable, rewound)
        return rewound, sorted(i for i in rewound if now.get(i, 0) <= before[i])
