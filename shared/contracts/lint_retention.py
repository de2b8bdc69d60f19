"""The lint's rule on the retention of the handler SDK's claims (rule ``claims-retention``).

A claim (``handler_applied``, one row per event a handler applied) is the handler's last
defence against applying an event twice: a copy arriving after its claim is purged (a
redelivery, a replay of its dead letter, a rewind within the stream's ``max_age``) would
be applied again, the inbox row being gone too or never consulted (a direct call). So a
context's ``claims_retention`` must outlast the same horizons as its ``inbox_retention``:
every durable delivering to the context, its stream's ``max_age``, its redelivery
horizon and its replay horizon.
"""

from __future__ import annotations

from collections.abc import Iterator

from shared.contracts.lint_findings import Problem, format_duration
from shared.contracts.lint_horizons import copy_horizons
from shared.contracts.topology import Topology


def claims_retention(topology: Topology, source: str) -> Iterator[Problem]:
    for name, ctx in sorted(topology.contexts.items()):
        needs = copy_horizons(topology, name)
        if not needs:
            continue
        need, what = max(needs, key=lambda item: item[0])
        if ctx.claims_retention < need:
            yield Problem(
                source,
                f"contexts.{name}.claims_retention",
                "claims-retention",
                f"{format_duration(ctx.claims_retention)} is shorter than the {what} "
                f"({format_duration(need)}): a copy arriving after its handler_applied "
                f"claim is purged would be applied twice by context {name}'s handler",
            )
