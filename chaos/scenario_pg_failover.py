"""The PostgreSQL failover drill (issue 28): the primary SIGKILLed mid-workload, the standby
promoted, nothing acknowledged lost, every role carrying on by itself.

``python -m chaos.run --scenario pg-failover [--schedule soak]``.

The world (:class:`PgFailoverWorld`) is the ordinary run's (:mod:`chaos.world`) with its one
PostgreSQL replaced by a pair (:class:`devstack.postgres_pair.PostgresPair`): a primary and
a streaming standby replicating **synchronously** (``synchronous_standby_names = '*'``,
``synchronous_commit = on``: a COMMIT returns only once the standby has flushed it). Every
context database of the run lives on the pair: physical replication copies a whole server,
so a failover moves every database at once, as it does for a CloudNativePG cluster holding
them (the drill fails over the target databases the handlers and consumers write to and the
source databases the producers and publishers use, in one go). Every role connects
**straight** to both servers with a multi-host DSN that asks for the writable one
(``postgresql://…@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``), not
through a proxy: a proxy in front of a dead server accepts the connection and then drops it,
which a client cannot tell from a server that failed mid-handshake. Their NATS and handler
links are proxied as in every run (no toxic is put on them).

The fault, during the workload of the ordinary run (:mod:`chaos.workload`):

``pg_failover``  SIGKILL the primary (postmaster and every backend at once), wait
                 ``promote_after`` seconds (the time an operator such as CloudNativePG needs
                 to decide the primary is gone), promote the standby with ``pg_promote()``;
                 in the long version the lost server then comes back on its port as the new
                 primary's synchronous standby (a fresh base backup), so the next failover
                 goes the other way. In the CI version the promoted server runs alone to
                 the end: commits no longer wait for anyone (production re-creates a
                 standby at once; CloudNativePG does).

What it shows, besides the ordinary invariants (:mod:`chaos.accounting`: 0 lost, dead
letters exactly the expected set, each id once per stream, 0 effects applied twice):

* **acknowledged but missing: 0** — every commit whose COMMIT returned to the producer
  (the ledger's ``committed``, taken before the uncertain ones are resolved) is in the
  outbox of the new primary afterwards;
* **no role restarted** — the publishers, consumers, handlers and the router reconnect to
  the promoted server on their own (:meth:`chaos.run_engine.Chaos._monitor` restarts and counts a
  role that died);
* per failover, **recovery time**: from the kill to the first event committed after it
  being processed, in the slowest durable; and **writes back**: from the kill to the first
  commit the producers saw acknowledged again.

The code is split by what it does: :mod:`chaos.scenario_pg_failover_plan` holds the name,
the sizes and the failover times; :mod:`chaos.scenario_pg_failover_world` the pair world;
:mod:`chaos.scenario_pg_failover_drill` the run itself (:class:`PgFailoverRun`);
:mod:`chaos.scenario_pg_failover_report` the results and their table. This module is the
entry point (:func:`main_failover`) and re-exports the names importers use.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from chaos.run import RunConfig
from chaos.scenario_pg_failover_drill import AT_RISK_SECONDS as AT_RISK_SECONDS
from chaos.scenario_pg_failover_drill import UNSURE as UNSURE
from chaos.scenario_pg_failover_drill import PgFailoverRun
from chaos.scenario_pg_failover_plan import SCENARIO, SIZES, FailoverSize, failover_times
from chaos.scenario_pg_failover_report import FailoverResult, render_failover_table
from chaos.scenario_pg_failover_report import FailoverRow as FailoverRow
from chaos.scenario_pg_failover_world import PgFailoverWorld

log = logging.getLogger("chaos.pg_failover")


async def run_failover_scenario(config: RunConfig, size: str = "ci") -> FailoverResult:
    """Run the drill (see the module docstring)."""
    return await PgFailoverRun(config, size).run_failover()


def main_failover(config: RunConfig) -> int:
    """``python -m chaos.run --scenario pg-failover``: run it, print the table; 0 if it passes."""
    if config.schedule not in SIZES:
        print("error: --scenario runs with --schedule ci or soak", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_failover_scenario(config, config.schedule))
    except KeyboardInterrupt:
        print(f"interrupted (seed {config.seed}); logs in {config.run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"scenario could not be set up (seed {config.seed}): {exc}", file=sys.stderr)
        log.exception("setup failed")
        return 2
    print()
    print(render_failover_table(result))
    print(f"\nreport: {config.run_dir}/pg-failover.json, pg-failover.txt, logs/")
    return 0 if result.ok else 1


__all__ = [
    "SCENARIO",
    "SIZES",
    "FailoverResult",
    "FailoverSize",
    "PgFailoverRun",
    "PgFailoverWorld",
    "failover_times",
    "main_failover",
    "render_failover_table",
    "run_failover_scenario",
]
