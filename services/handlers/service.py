"""The example handler services, built on the handler SDK (:mod:`shared.sdk`).

Each service is an SDK :class:`~shared.sdk.Handler` named after its context, on that
context's database, whose routes are the functions the manifests name
(:class:`ServiceSpec`), whose schemas come from the topology, and which keeps the effects
ledger (``handler_calls``) that the tests and the chaos suite count. With fault
injection on, :class:`~services.handlers.faults.FaultInjection` is its one hook.
Everything else — parsing, the claim in the route's transaction, the statuses — is the
SDK's, the same code a team's handler service runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.access.identities import Identity
from shared.adapters.postgres import Pool
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError
from shared.sdk import Handler, handled_events, one_statement, topology_schemas
from shared.sdk.handler import AnyRoute, Route, RouteKey, StatementRoute, is_one_statement

from .faults import FaultInjection

__all__ = [
    "HandlerService",
    "Route",
    "RouteKey",
    "ServiceSpec",
    "StatementRoute",
    "build_service",
    "handled_events",
    "is_one_statement",
    "one_statement",
]


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A concrete handler service: its context name, its own tables and its routes."""

    name: str
    tables: tuple[str, ...]
    routes: Mapping[RouteKey, Callable[..., Any]]


class HandlerService(Handler):
    """An example service: an SDK handler with the ledger, and fault injection if asked."""

    def __init__(
        self,
        *,
        name: str,
        pool: Pool | None,
        routes: Mapping[RouteKey, AnyRoute | Callable[..., Any]],
        schemas: Mapping[RouteKey, Mapping[str, Any]] | None = None,
        tables: Sequence[str] = (),
        fault_injection: bool = False,
        purge_login: str | None = None,
    ) -> None:
        super().__init__(
            name,
            pool=pool,
            schemas=schemas,
            tables=tables,
            ledger=True,
            hooks=(FaultInjection(),) if fault_injection else (),
            # A batch call (handler.batch >= 2) is applied in one transaction, a
            # savepoint per event: module F forwards a whole batch with one commit.
            batch_transaction=True,
            purge_login=purge_login,
        )
        for key, route in routes.items():
            self.add_route(key, route)
        #: Whether ``_ferry_test`` directives are obeyed (off: the field is plain data).
        self.fault_injection = fault_injection


def build_service(
    spec: ServiceSpec,
    *,
    pool: Pool | None,
    topology: Topology,
    fault_injection: bool = False,
    platform_routes: Mapping[RouteKey, Callable[..., Any]] | None = None,
) -> HandlerService:
    """A :class:`HandlerService` for ``spec``, checked against and schema-fed by ``topology``.

    Refuses (:class:`ConfigurationError`) a topology that sends this context an event the
    service has no route for. ``fault_injection`` turns the ``_ferry_test`` directives on.
    ``platform_routes`` (the platform's, such as the replay jobs' bound to their worker)
    win over the spec's routes for the same event. ``pool`` None: :meth:`bind` one later.
    """
    topology.context(spec.name)
    routes = {**spec.routes, **(platform_routes or {})}
    expected = handled_events(topology, spec.name)
    missing = sorted(set(expected) - set(routes))
    if missing:
        names = ", ".join(f"{event_type}.v{version}" for event_type, version in missing)
        raise ConfigurationError(
            f"topology {topology.name!r} sends {names} to context {spec.name!r}, "
            f"but the {spec.name} handler has no route for it"
        )
    return HandlerService(
        name=spec.name,
        pool=pool,
        routes=routes,
        schemas=topology_schemas(topology, spec.name),
        tables=spec.tables,
        fault_injection=fault_injection,
        # The topology's retention role purges old claims (claims_retention).
        purge_login=Identity("retention", topology.name).pg_role,
    )
