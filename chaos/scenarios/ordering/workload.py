"""The ordering scenario's workload (:mod:`chaos.scenarios.ordering.play`) and its traces.

**Keys.** Each producing context gets a fixed set of keys (aggregates); every event goes
to one of them, so each key receives several events over the run. One producer per
context (:class:`chaos.engine.workload.Producer`) commits them one transaction after another in
plan order, so the *commit order* of a key's events is their plan order, and the intent
ledger (``ledger.jsonl``) records it line by line.

**Classes**, by the policy of the durable that handles the event:

==========  =============================================  =================================
class       payload directive (``_ferry_test``)             what must become of it
==========  =============================================  =================================
normal      none                                           applied, in its place
slow        ``slow_ms`` 100-300                            applied, in its place
transient   ``fail_attempts`` 1-3, ``retry_after`` 0.2     retried (its key parked meanwhile),
                                                           then applied in its place
poison      ``poison``                                     ``hold``: dead letter, its key held
                                                           until the operator discards it;
                                                           ``skip``: dead letter recording
                                                           ``order_broken_after``, key goes on
exhausting  ``fail_attempts`` 1000 (``skip`` only)         as poison under ``skip``
fixed       ``reject_until`` T (``hold`` only)             a 422 until T (a bug fixed at T):
                                                           dead letter, key held; the operator
                                                           replays it after T and it is
                                                           applied in its place
==========  =============================================  =================================

**Traces.** Triggers installed in each target database record what the consumers do to
``parked_messages`` (every park, state change and release) and to ``partition_leases``
(every acquisition, with whom it was taken from and whether that owner had released it),
so parking and takeovers are counted exactly however often a consumer is killed. A
stall trigger (:mod:`chaos.engine.stall`) on the insert of a held head lets the run SIGKILL a
consumer exactly between a held head's dead letter and the parking of its key.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import asyncpg

from chaos.engine.workload import Intent, directive, make_intent
from shared.contracts.topology import Topology
from shared.domain.envelope import format_timestamp

#: Shares of the classes per ``on_dead_letter`` policy (the rest is ``normal``).
CLASSES: dict[str, tuple[tuple[str, float], ...]] = {
    "hold": (("poison", 0.02), ("fixed", 0.04), ("transient", 0.08), ("slow", 0.03)),
    "skip": (("poison", 0.03), ("exhausting", 0.015), ("transient", 0.08), ("slow", 0.03)),
}
#: Seconds after an event's planned commit until its handler bug is "fixed".
FIX_AFTER = 15.0

TRACE_DDL = """
CREATE TABLE IF NOT EXISTS chaos_parked_trace (
  id BIGSERIAL PRIMARY KEY,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  op TEXT NOT NULL,
  durable TEXT NOT NULL,
  ordering_key TEXT NOT NULL,
  message_id UUID NOT NULL,
  partition INT,
  state TEXT,
  reason TEXT
);
CREATE OR REPLACE FUNCTION chaos_parked_trace() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO chaos_parked_trace (op, durable, ordering_key, message_id, partition, state,
                                    reason)
    VALUES ('park', NEW.durable, NEW.ordering_key, NEW.message_id, NEW.partition, NEW.state,
            NEW.reason);
  ELSIF TG_OP = 'UPDATE' THEN
    IF NEW.state IS DISTINCT FROM OLD.state THEN
      INSERT INTO chaos_parked_trace (op, durable, ordering_key, message_id, partition, state,
                                      reason)
      VALUES (OLD.state || '->' || NEW.state, NEW.durable, NEW.ordering_key, NEW.message_id,
              NEW.partition, NEW.state, NEW.reason);
    END IF;
  ELSE
    INSERT INTO chaos_parked_trace (op, durable, ordering_key, message_id, partition, state,
                                    reason)
    VALUES ('release', OLD.durable, OLD.ordering_key, OLD.message_id, OLD.partition, OLD.state,
            OLD.reason);
  END IF;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_parked_trace ON parked_messages;
CREATE TRIGGER chaos_parked_trace AFTER INSERT OR UPDATE OR DELETE ON parked_messages
  FOR EACH ROW EXECUTE FUNCTION chaos_parked_trace();

CREATE TABLE IF NOT EXISTS chaos_lease_trace (
  id BIGSERIAL PRIMARY KEY,
  at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  op TEXT NOT NULL,
  durable TEXT NOT NULL,
  partition INT NOT NULL,
  owner TEXT NOT NULL,
  previous_owner TEXT,
  previous_released BOOLEAN
);
CREATE OR REPLACE FUNCTION chaos_lease_trace() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO chaos_lease_trace (op, durable, partition, owner)
    VALUES ('fresh', NEW.durable, NEW.partition, NEW.owner);
  ELSIF NEW.acquired_at IS DISTINCT FROM OLD.acquired_at THEN
    INSERT INTO chaos_lease_trace (op, durable, partition, owner, previous_owner,
                                   previous_released)
    VALUES (CASE WHEN NEW.previous_released THEN 'after_release'
                 WHEN NEW.previous_owner = NEW.owner THEN 'again'
                 ELSE 'takeover' END,
            NEW.durable, NEW.partition, NEW.owner, NEW.previous_owner, NEW.previous_released);
  ELSIF NEW.released AND NOT OLD.released THEN
    INSERT INTO chaos_lease_trace (op, durable, partition, owner)
    VALUES ('release', NEW.durable, NEW.partition, NEW.owner);
  END IF;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_lease_trace ON partition_leases;
CREATE TRIGGER chaos_lease_trace AFTER INSERT OR UPDATE ON partition_leases
  FOR EACH ROW EXECUTE FUNCTION chaos_lease_trace();

-- The crash window of a held head (chaos.engine.stall): its dead letter is written, its key's
-- parking not yet.
DROP TRIGGER IF EXISTS chaos_stall ON parked_messages;
CREATE TRIGGER chaos_stall BEFORE INSERT ON parked_messages FOR EACH ROW
  WHEN (NEW.state = 'held') EXECUTE FUNCTION chaos_stall();
"""
#: The stalled statement of that window, as pg_stat_activity shows it.
HELD_PARK = ("parked_messages", "%INSERT INTO parked_messages%")


async def install_traces(dsn: str) -> None:
    """The parking and lease traces (see the module docstring), idempotently."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(TRACE_DDL)
    finally:
        await conn.close()


def _directive(klass: str, rng: random.Random) -> dict[str, Any] | None:
    if klass == "fixed":
        return {"reject_until": None}  # set by arm_fixes once the run's clock is known
    return directive(klass, rng, slow_ms=(100, 300))


def _classes(policy: str, count: int, rng: random.Random) -> list[str]:
    """Exactly the policy's shares of ``count`` events (at least one of each), shuffled."""
    labels: list[str] = []
    for name, share in CLASSES[policy]:
        labels += [name] * max(1, round(share * count))
    labels = labels[:count] + ["normal"] * max(count - len(labels), 0)
    rng.shuffle(labels)
    return labels


def plan_ordered(
    topology: Topology,
    seed: int,
    count: int,
    seconds: float,
    keys_per_context: int,
) -> list[Intent]:
    """``count`` events over ``seconds``, each of one of each context's keys (seeded)."""
    rng = random.Random(f"ordering-{seed}")
    producible = [e for e in topology.events if e.handled_by]
    contexts = sorted({e.context for e in producible})
    per_context = {
        c: [n for n in range(count) if contexts[n % len(contexts)] == c] for c in contexts
    }
    intents: list[Intent] = []
    for context in contexts:
        events = [e for e in producible if e.context == context]
        durable = events[0].handled_by[0]
        policy = topology.durables[durable].on_dead_letter
        slots = per_context[context]
        labels = _classes(policy, len(slots), rng)
        for n, klass in zip(slots, labels, strict=True):
            event = rng.choice(events)
            aggregate = f"k{rng.randrange(keys_per_context):03d}"
            due = seconds * n / max(count, 1)
            test = _directive(klass, rng)
            intents.append(make_intent(rng, event, n, aggregate, klass, test, due, durable))
    intents.sort(key=lambda i: i.due)
    return intents


#: Classes that hold nothing back: the handler applies them on their first call.
UNHINDERED = frozenset({"normal", "slow"})


def behind_no_failure(intents: list[Intent]) -> list[Intent]:
    """The intents no earlier intent of their durable and key fails before (in plan
    order, which is each key's commit order)."""
    failed: set[tuple[str | None, str]] = set()
    kept: list[Intent] = []
    for intent in sorted(intents, key=lambda i: i.due):
        key = (intent.durable, ordering_key_of(intent))
        if key in failed:
            continue
        if intent.klass not in UNHINDERED:
            failed.add(key)
        kept.append(intent)
    return kept


def ordering_key_of(intent: Intent) -> str:
    """The key the consumer orders ``intent`` by (the aggregate: no manifest names a field)."""
    return f"{intent.event_type.split('_')[0]}/{intent.aggregate_id}"


def fix_time(intent: Intent, origin: float) -> float:
    """When the handler bug of a ``fixed`` event is fixed (epoch seconds)."""
    return origin + intent.due + FIX_AFTER


def arm_fixes(intents: list[Intent], origin: float) -> None:
    """Give each ``fixed`` event its ``reject_until``, now that the run's start is known."""
    for intent in intents:
        if intent.klass == "fixed":
            moment = datetime.fromtimestamp(fix_time(intent, origin), UTC)
            intent.payload["_ferry_test"] = {"reject_until": format_timestamp(moment)}
