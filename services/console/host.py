"""What the console's pages need of the console that hosts them (:class:`.app.Console`
is one): a protocol, so the pages depend on it and not on the application module."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import Counter, Histogram

from shared.adapters.nats import NatsClient
from shared.adapters.postgres import Pool
from shared.contracts.topology import Topology

from .auth import Session
from .jobs import Jobs
from .settings import ConsoleSettings


class Host(Protocol):
    """The console as its pages see it: settings, connections, jobs, rendering, sessions."""

    settings: ConsoleSettings
    topology: Topology
    pools: dict[str, Pool]
    jobs: Jobs
    actions: Counter
    render_seconds: Histogram

    @property
    def nc(self) -> NatsClient | None: ...

    def render(
        self, request: web.Request, template: str, status: int = 200, **context: Any
    ) -> web.Response: ...

    def error_page(self, request: web.Request, message: str, status: int) -> web.Response: ...

    def session_of(self, request: web.Request) -> Session: ...

    def leave_note(self, response: web.StreamResponse, text: str, path: str) -> None: ...

    def log_action(self, text: str, actor: str) -> None: ...

    def operator(self, request: web.Request) -> Session: ...
