"""Routes: how one event's effect is applied, and a batch's effects in their order.

A route is ``async def f(conn, call)``, run on the claiming transaction's connection, or
a function marked :func:`one_statement` that returns its effect as one
:class:`~shared.adapters.postgres.Statement` (the handler then sends claim and effect as
one statement). :func:`statement_runs` gathers a batch's consecutive statements of one
SQL text so that :func:`execute_run` sends them as one pipelined ``executemany``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from shared.adapters.postgres import Conn, Statement
from shared.contracts.events import ONE_STATEMENT_MARK

from .request import Call

if TYPE_CHECKING:
    from .outcomes import Outcome

RouteKey = tuple[str, int]
#: A route applies one event's state change on ``conn``, inside the claiming transaction.
Route = Callable[[Conn, Call[Any]], Awaitable[None]]
#: A route that builds its effect without a connection, marked with :func:`one_statement`.
StatementRoute = Callable[[Call[Any]], Statement]
AnyRoute = Route | StatementRoute
R = TypeVar("R", bound=Callable[..., Any])


#: Seconds to wait for a pooled connection; below the consumer's handler timeouts (10 s+)
#: so a saturated pool answers 503 instead of letting the consumer time out blind.
ACQUIRE_TIMEOUT = 5.0


def one_statement(route: R) -> R:
    """Mark ``route`` (``def f(call) -> Statement``) as giving its effect as one statement.

    The handler then sends claim and effect as ONE statement — one round trip and its own
    transaction — instead of a transaction of several round trips: the choice for a route
    whose effect is one statement. One that needs several, or reads before it writes,
    stays an ``async def f(conn, call)``.
    """
    setattr(route, ONE_STATEMENT_MARK, True)
    return route


def is_one_statement(route: Callable[..., Any]) -> bool:
    """Whether ``route`` was marked with :func:`one_statement`."""
    return bool(getattr(route, ONE_STATEMENT_MARK, False))


class Hook(Protocol):
    """Runs on every well-formed call before the claim (Ferry's fault injection is one)."""

    def prepare(self, call: Call[Any]) -> Call[Any]:
        """The call to process (maybe another view of its payload); may raise ``Reject``."""

    async def before(self, call: Call[Any]) -> Outcome | None:
        """An answer to give instead of processing the call, or None to process it."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A call checked up to its claim, with the route that applies it."""

    call: Call[Any]
    route: AnyRoute


async def run_route(conn: Conn, prepared: Prepared) -> None:
    """The route's effect on ``conn`` (a one-statement route's statement, executed)."""
    if is_one_statement(prepared.route):
        statement = cast(StatementRoute, prepared.route)(prepared.call)
        await conn.execute(statement.sql, *statement.args)
    else:
        await cast(Route, prepared.route)(conn, prepared.call)


#: A stretch of a batch's effects, in order: one-statement routes' statements sharing one
#: SQL text (executed as one pipelined ``executemany``), or one route of another kind.
EffectRun = list[Statement] | Prepared


def statement_runs(prepared: Sequence[Prepared]) -> list[EffectRun]:
    """The batch's effects in their order, consecutive statements of one SQL text gathered.

    Building a statement may raise (a route refusing its payload): it raises here, before
    anything of the batch ran, and the caller goes event by event.
    """
    runs: list[EffectRun] = []
    for item in prepared:
        if not is_one_statement(item.route):
            runs.append(item)
            continue
        statement = cast(StatementRoute, item.route)(item.call)
        last = runs[-1] if runs else None
        if isinstance(last, list) and last[0].sql == statement.sql:
            last.append(statement)
        else:
            runs.append([statement])
    return runs


async def execute_run(conn: Conn, run: EffectRun) -> None:
    """Execute one stretch: N statements of one SQL text in one round trip (asyncpg
    pipelines ``executemany``'s executions and stops at the first error), or a route."""
    if isinstance(run, Prepared):
        await cast(Route, run.route)(conn, run.call)
    elif len(run) == 1:
        await conn.execute(run[0].sql, *run[0].args)
    else:
        await conn.executemany(run[0].sql, [statement.args for statement in run])


def aggregate_of(call: Call[Any]) -> tuple[str, str]:
    """The call's aggregate (type, id): a batch transaction's lock order."""
    return call.envelope.aggregate_type, call.envelope.aggregate_id
