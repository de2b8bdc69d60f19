"""Counting the ordering scenario: per key, the effects applied against the commit order.

Sources, read directly after the drain:

* the intent ledger — each committed event, its class, its key; a context's events were
  committed one transaction after another in plan order, so a key's **commit order** is
  its plan order (checked against the ledger's commit times);
* each event's fate (:func:`chaos.engine.settled.count_settled`) and its dead letter
  (status, and the ``ordering`` part of the record);
* the target handler's effects ledger: ``handler_calls`` rows answered 200, in ``id``
  order — the **applied order** (a 200 row commits with its effect, and a key's events
  reach the handler one at a time, so a later effect's row always has a larger id);
* the traces of :mod:`chaos.scenarios.ordering.workload` (parks, releases, lease takeovers).

For every key, the applied sequence must equal the commit order, leaving out only the
events legitimately not applied: dead-lettered under ``skip`` (whose record must say
``order_broken_after``) or discarded by the operator under ``hold``. An **order violation**
is a pair of the key's events applied in the reverse of their commit order; an event
missing from the applied sequence, or applied though left out, is an outcome violation.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from chaos.engine.db import fetch
from chaos.engine.settled import Settled
from chaos.engine.workload import Intent, Ledger
from chaos.scenarios.ordering.workload import ordering_key_of
from shared.contracts.topology import Topology

#: What each class must become, by policy: ``applied``, ``skipped`` or ``discarded``.
OUTCOMES = {
    "hold": {"poison": "discarded"},
    "skip": {"poison": "skipped", "exhausting": "skipped"},
}


@dataclass
class DurableOrder:
    """The ordering count of one durable."""

    durable: str
    policy: str
    partitions: int
    keys: int = 0
    events: int = 0
    applied: int = 0
    skipped: int = 0
    discarded: int = 0
    replayed_heads: int = 0
    fixed_before_delivery: int = 0
    order_violations: int = 0
    keys_out_of_order: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    applied_though_left_out: list[str] = field(default_factory=list)
    wrong_outcome: list[str] = field(default_factory=list)
    unrecorded_skip: list[str] = field(default_factory=list)
    parked_events: int = 0
    parked_keys: int = 0
    held_heads: int = 0
    unheld_by_replay: int = 0
    released: int = 0
    discarded_heads: int = 0
    still_parked: int = 0
    takeovers: int = 0
    clean_handovers: int = 0
    acquisitions: int = 0


@dataclass
class OrderCount:
    """Every durable's count, and the breaches."""

    durables: dict[str, DurableOrder]
    ledger_out_of_order: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        """A counter summed over the durables."""
        return sum(int(getattr(d, name)) for d in self.durables.values())

    def violations(self) -> list[str]:
        """Every breach, one line each."""
        out: list[str] = []
        for d in self.durables.values():
            if d.order_violations:
                shown = ", ".join(d.keys_out_of_order[:4])
                out.append(
                    f"{d.durable}: ORDER VIOLATIONS {d.order_violations} in "
                    f"{len(d.keys_out_of_order)} key(s) ({shown})"
                )
            for what, items in (
                ("committed, not applied and not legitimately left out", d.missing),
                ("applied though dead-lettered or discarded", d.applied_though_left_out),
                ("outcome differs from the class", d.wrong_outcome),
                ("skipped dead letters without order_broken_after", d.unrecorded_skip),
            ):
                if items:
                    out.append(f"{d.durable}: {what}: {len(items)} ({', '.join(items[:4])})")
            if d.still_parked:
                out.append(f"{d.durable}: {d.still_parked} message(s) still parked")
        if self.ledger_out_of_order:
            out.append(f"ledger commit order differs from plan order: {self.ledger_out_of_order}")
        return out

    def table(self) -> dict[str, Any]:
        """The scenario table's ordering rows (totals, then per durable)."""
        rows: dict[str, Any] = {
            "keys": self.total("keys"),
            "events (committed, ordered durables)": self.total("events"),
            "order violations": self.total("order_violations"),
            "applied in commit order": self.total("applied"),
            "skipped (dead letter, order_broken_after)": self.total("skipped"),
            "discarded held heads (operator)": self.total("discarded"),
            "replayed held heads (operator)": self.total("replayed_heads"),
            "parked events": self.total("parked_events"),
            "parked keys": self.total("parked_keys"),
            "held heads": self.total("held_heads"),
            "released from parking": self.total("released"),
            "partition takeovers": self.total("takeovers"),
            "clean partition handovers": self.total("clean_handovers"),
        }
        rows["per durable"] = {
            name: {
                k: v if not isinstance(v, list) else len(v)
                for k, v in vars(d).items()
                if k != "durable"
            }
            for name, d in self.durables.items()
        }
        return rows


def inversions(expected: list[str], applied: list[str]) -> int:
    """Pairs of ``applied`` in the reverse of their order in ``expected``."""
    place = {m: i for i, m in enumerate(expected)}
    ranks = [place[m] for m in applied if m in place]
    return sum(1 for i, a in enumerate(ranks) for b in ranks[i + 1 :] if b < a)


def _ledger_order(ledger: Ledger) -> list[str]:
    """Contexts whose committed events' commit times go backwards in plan order."""
    out = []
    last: dict[str, float] = {}
    for intent in sorted(ledger.intents.values(), key=lambda i: i.due):
        if intent.status != "committed" or intent.committed_at is None:
            continue
        if intent.committed_at < last.get(intent.context, 0.0):
            out.append(f"{intent.context}: {intent.id}")
        last[intent.context] = intent.committed_at
    return out


async def count_order(
    topology: Topology, dsns: dict[str, str], ledger: Ledger, settled: Settled
) -> OrderCount:
    """Read every source and count (see the module docstring)."""
    committed = [i for i in ledger.intents.values() if i.id in settled.fate]
    committed.sort(key=lambda i: i.due)
    count = OrderCount(durables={}, ledger_out_of_order=_ledger_order(ledger))
    for name, spec in sorted(topology.durables.items()):
        if spec.ordering != "key":
            continue
        mine = [i for i in committed if i.durable == name]
        partitions = topology.consumer_partitions(name)
        d = DurableOrder(name, spec.on_dead_letter, partitions, events=len(mine))
        await _count_durable(d, dsns[spec.target], spec.target, mine, settled)
        await _count_traces(d, dsns[spec.target])
        count.durables[name] = d
    return count


async def _count_durable(
    d: DurableOrder, dsn: str, handler: str, mine: list[Intent], settled: Settled
) -> None:
    dead = {
        str(r["id"]): r
        for r in await fetch(
            dsn,
            "SELECT message_id AS id, status, reason_code, record -> 'ordering' AS ordering"
            " FROM dead_letters WHERE durable = $1",
            d.durable,
        )
    }
    ids = {i.id for i in mine}
    applied = [
        str(r["mid"])
        for r in await fetch(
            dsn,
            "SELECT message_id AS mid FROM handler_calls WHERE handler = $1 AND status = 200"
            " ORDER BY id",
            handler,
        )
        if str(r["mid"]) in ids
    ]
    by_key: dict[str, list[Intent]] = defaultdict(list)
    for intent in mine:
        by_key[ordering_key_of(intent)].append(intent)
    d.keys = len(by_key)
    key_of = {i.id: ordering_key_of(i) for i in mine}
    applied_by_key: dict[str, list[str]] = defaultdict(list)
    for mid in applied:
        applied_by_key[key_of[mid]].append(mid)
    for key, intents in sorted(by_key.items()):
        expected = []
        for intent in intents:
            outcome = _outcome(d, intent, settled.fate.get(intent.id, ""), dead.get(intent.id))
            if outcome == "applied":
                expected.append(intent.id)
        got = applied_by_key.get(key, [])
        left_out = {i.id for i in intents} - set(expected)
        d.applied_though_left_out += [f"{m} ({key})" for m in got if m in left_out]
        d.missing += [f"{m} ({key})" for m in expected if m not in set(got)]
        wrong = inversions(expected, got)
        if wrong:
            d.order_violations += wrong
            d.keys_out_of_order.append(key)
        d.applied += sum(1 for m in got if m in set(expected))


def _outcome(d: DurableOrder, intent: Intent, fate: str, dead: asyncpg.Record | None) -> str:
    """What became of ``intent`` (``applied``, ``skipped``, ``discarded``), checked against
    its class."""
    wanted = OUTCOMES[d.policy].get(intent.klass, "applied")
    label = f"{intent.id} ({intent.klass} → {fate or '?'})"
    if fate == "processed":
        outcome = "applied"
        if intent.klass == "fixed":
            if dead is not None:
                d.replayed_heads += 1
            else:
                d.fixed_before_delivery += 1
    elif fate.startswith("dead_letter:") and dead is not None:
        ordering = json.loads(dead["ordering"]) if dead["ordering"] else {}
        if dead["status"] == "discarded":
            outcome = "discarded"
            d.discarded += 1
        elif d.policy == "skip":
            outcome = "skipped"
            d.skipped += 1
            if ordering.get("order_broken_after") is not True:
                d.unrecorded_skip.append(label)
        else:
            outcome = f"dead letter {dead['status']}"
    else:
        outcome = fate or "no fate"
    if outcome != wanted:
        d.wrong_outcome.append(label)
    return outcome


async def _count_traces(d: DurableOrder, dsn: str) -> None:
    parks = await fetch(
        dsn,
        "SELECT op, ordering_key, message_id, state FROM chaos_parked_trace"
        " WHERE durable = $1 ORDER BY id",
        d.durable,
    )
    discarded = {
        r["message_id"]
        for r in await fetch(
            dsn,
            "SELECT message_id FROM dead_letters WHERE durable = $1 AND status = 'discarded'",
            d.durable,
        )
    }
    ops = Counter(r["op"] for r in parks)
    d.parked_events = len({r["message_id"] for r in parks if r["op"] == "park"})
    d.parked_keys = len({r["ordering_key"] for r in parks if r["op"] == "park"})
    d.held_heads = sum(
        1
        for r in parks
        if r["state"] == "held" and (r["op"] == "park" or r["op"].endswith(">held"))
    )
    d.unheld_by_replay = ops["held->retrying"]
    releases = [r for r in parks if r["op"] == "release"]
    d.discarded_heads = sum(1 for r in releases if r["message_id"] in discarded)
    d.released = len(releases) - d.discarded_heads
    still = await fetch(
        dsn, "SELECT count(*) AS n FROM parked_messages WHERE durable = $1", d.durable
    )
    d.still_parked = int(still[0]["n"])
    leases = Counter(
        r["op"]
        for r in await fetch(dsn, "SELECT op FROM chaos_lease_trace WHERE durable = $1", d.durable)
    )
    d.takeovers = leases["takeover"]
    d.clean_handovers = leases["after_release"]
    d.acquisitions = (
        leases["fresh"] + leases["takeover"] + leases["after_release"] + leases["again"]
    )
