"""The failover drill's world (:mod:`chaos.scenarios.pg_failover`): the ordinary run's world
on a synchronous primary/standby PostgreSQL pair, every role on the pair's multi-host DSNs."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from chaos.engine.tuning import CRASHABLE_PG, Tuning
from chaos.engine.world import World, start_all
from devstack.nats import NatsServer
from devstack.postgres import PostgresServer
from devstack.postgres_pair import PostgresPair


class PgFailoverWorld(World):
    """The run's world on a primary/standby pair (see :mod:`chaos.scenarios.pg_failover`)."""

    direct = frozenset({"pg"})

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
        await start_all(self.pair.start, self.nats.start)

    def _direct_settings(self, direct: list[str]) -> dict[str, str]:
        """A role's databases are the pair's multi-host DSNs, not a proxy."""
        if "pg" not in direct:
            return {}
        pair = self.pg_pair()
        return {"FERRY_DATABASES": json.dumps({db: pair.dsn(db) for db in self.topo.databases()})}

    def _server_stops(self) -> list[Callable[[], None]]:
        return [s for s in (self.nats and self.nats.stop, self.pair and self.pair.stop) if s]
