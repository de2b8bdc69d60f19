"""The scenario registry: the one place that maps a ``--scenario`` name to what runs it.

============================  ========================================================
``long-outage``               :mod:`chaos.scenarios.long_outage`
``hostile-handler``           :mod:`chaos.scenarios.hostile_handler`
``hostile-payloads``          :mod:`chaos.scenarios.hostile_payloads`
``ordering``                  :mod:`chaos.scenarios.ordering`
``restore``                   :mod:`chaos.scenarios.restore`
``cluster``, ``cluster-*``    :mod:`chaos.scenarios.cluster`
``pg-failover``               :mod:`chaos.scenarios.pg_failover`
``handler-outage``            :mod:`chaos.scenarios.handler_outage`
(no ``--scenario``)           :mod:`chaos.scenarios.fault_schedule`, the ordinary run
============================  ========================================================

The first five are plays of :class:`~chaos.engine.scenario.ScenarioRun`; the others are runs
of their own. :func:`run_scenario` runs one and writes its result files
(:mod:`chaos.engine.results`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from chaos.engine.config import RunConfig
from chaos.engine.results import Result, write_result
from chaos.engine.scenario import Play, ScenarioRun
from chaos.scenarios.cluster.plan import CLUSTER_SCENARIOS
from chaos.scenarios.cluster.run import ClusterRun
from chaos.scenarios.fault_schedule.run import ScheduleRun
from chaos.scenarios.handler_outage.run import HandlerOutageRun
from chaos.scenarios.hostile_handler.play import HostileHandler
from chaos.scenarios.hostile_payloads.play import HostilePayloads
from chaos.scenarios.long_outage.play import LongOutage
from chaos.scenarios.ordering.play import Ordering
from chaos.scenarios.pg_failover.run import PgFailoverRun
from chaos.scenarios.restore.play import Restore

#: (the config, the scenario's name, its size: ``ci`` or ``soak``) -> its result.
Runner = Callable[[RunConfig, str, str], Awaitable[Result]]


@dataclass(frozen=True)
class Scenario:
    """What runs a scenario, and the ``--schedule`` values it accepts."""

    run: Runner
    schedules: tuple[str, ...] = ("ci", "soak")


def _play(play: type[Play]) -> Scenario:
    def run(config: RunConfig, name: str, size: str) -> Awaitable[Result]:
        return ScenarioRun(config, name, play, size).run()

    return Scenario(run)


def _cluster(config: RunConfig, name: str, size: str) -> Awaitable[Result]:
    return ClusterRun(config, name, size).run()


def _pg_failover(config: RunConfig, name: str, size: str) -> Awaitable[Result]:
    return PgFailoverRun(config, size).run()


def _handler_outage(config: RunConfig, name: str, size: str) -> Awaitable[Result]:
    return HandlerOutageRun(config, size).run()


def _fault_schedule(config: RunConfig, name: str, size: str) -> Awaitable[Result]:
    return ScheduleRun(config).run()


#: Every ``--scenario``, in the order the command lists them.
SCENARIOS: dict[str, Scenario] = {
    "long-outage": _play(LongOutage),
    "hostile-handler": _play(HostileHandler),
    "hostile-payloads": _play(HostilePayloads),
    "ordering": _play(Ordering),
    "restore": _play(Restore),
    **{name: Scenario(_cluster) for name in CLUSTER_SCENARIOS},
    "pg-failover": Scenario(_pg_failover),
    "handler-outage": Scenario(_handler_outage),
}
#: The ordinary run (no ``--scenario``): a fault schedule, ``ci``, ``soak`` or ``custom``.
FAULT_SCHEDULE = Scenario(_fault_schedule, schedules=("ci", "soak", "custom"))


def scenario(name: str | None) -> Scenario:
    """The scenario of that name (None: the ordinary run)."""
    return FAULT_SCHEDULE if name is None else SCENARIOS[name]


async def run_scenario(config: RunConfig, name: str | None, size: str = "ci") -> Result:
    """Run scenario ``name`` (None: the ordinary run) at ``size``; write its result files."""
    result = await scenario(name).run(config, name or "", size)
    write_result(result)
    return result
