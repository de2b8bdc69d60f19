"""The failover drill's world (:mod:`chaos.scenario_pg_failover`): the ordinary run's world
on a synchronous primary/standby PostgreSQL pair, every role on the pair's multi-host DSNs."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from chaos.world import CRASHABLE_PG, Tuning, World
from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from devstack.postgres_pair import PostgresPair


class PgFailoverWorld(World):
    """The run's world on a primary/standby pair (see :mod:`chaos.scenario_pg_failover`)."""

    def __init__(self, run_dir: Path, seed: int, tuning: Tuning | None = None) -> None:
        super().__init__(run_dir, seed, tuning)
        self.pair: PostgresPair | None = None

    def pg_pair(self) -> PostgresPair:
        """The run's two PostgreSQL servers."""
        assert self.pair is not None, "the world is not started"
        return self.pair

    def postgres(self) -> PostgresServer:
        """The current primary."""
        return self.pg_pair().primary

    def direct_dsn(self, context: str) -> str:
        """The multi-host DSN of a context's database (whichever server is writable)."""
        return self.pg_pair().dsn(self.topo.context(context).database)

    async def _start_servers(self) -> None:
        self._pg_base = Path(tempfile.mkdtemp(prefix="ferry-chaos-pgpair-"))
        self._pg_base.chmod(0o711)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pair = PostgresPair(self._pg_base, logs=self.logs, extra_settings=CRASHABLE_PG)
        self.pg = self.pair.primary
        self.nats = NatsServer(self.run_dir / "nats")
        outcomes = await asyncio.gather(
            asyncio.to_thread(self.pair.start),
            asyncio.to_thread(self.nats.start),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _add_role(
        self,
        name: str,
        kind: str,
        args: list[str],
        *,
        links: tuple[str, ...],
        durables: frozenset[str] = frozenset(),
        handler_service: str | None = None,
    ) -> None:
        """As in :class:`World`, but a role's databases are the pair's multi-host DSNs."""
        super()._add_role(
            name,
            kind,
            args,
            links=tuple(link for link in links if link != "pg"),
            durables=durables,
            handler_service=handler_service,
        )
        if "pg" in links:
            pair = self.pg_pair()
            databases = {db: pair.dsn(db) for db in self.topo.databases()}
            self.roles[name].env["FERRY_DATABASES"] = json.dumps(databases)

    async def stop(self) -> None:
        """Stop every role, the proxy, NATS and whichever PostgreSQL still runs."""
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in self.roles.values()))
        if self.toxi is not None:
            await asyncio.to_thread(self.toxi.stop)
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        if self.pair is not None:
            await asyncio.to_thread(self.pair.stop)
        if self._pg_base is not None:
            shutil.rmtree(self._pg_base, ignore_errors=True)
