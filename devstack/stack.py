"""``python -m devstack.stack up [--demo]``: the whole platform under supervisord.

Picks free ports (unless given), exports the FERRY_* variables supervisord.conf
expands, starts supervisord in the foreground as a child, waits until every program
runs and the bootstrap finished, then either drives the demo workload or waits.
Ctrl-C (or SIGTERM) stops supervisord, which stops every role inside its deadline.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import os
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from supervisor.xmlrpc import SupervisorTransport  # type: ignore[import-untyped]

from devstack.console import write_console_accounts
from devstack.credentials import (
    admin_nats_env,
    check_var_dir,
    hostport,
    secrets_of,
    write_role_credentials,
)
from devstack.nats import tls_block
from devstack.nats_cluster import CLUSTER_SIZE, NatsCluster, RouteTLS
from devstack.ports import free_port
from devstack.postgres import cluster_major, server_major, system_postgres
from devstack.secrets import write_handler_secrets
from devstack.tls import StackTLS, stack_certificates
from shared.access.nats_auth import DevAccess
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
#: Port variables supervisord.conf expands; each gets a free port unless already set.
PORT_VARS = (
    "FERRY_NATS_PORT", "FERRY_NATS_MONITOR_PORT", "FERRY_PG_PORT",
    "FERRY_PORT_PUB_SEA", "FERRY_PORT_PUB_VIBESPRO", "FERRY_PORT_PUB_MODULE_E",
    "FERRY_PORT_PUB_MODULE_F", "FERRY_PORT_PUB_MODULE_G", "FERRY_PORT_PUB_MODULE_H",
    "FERRY_PORT_HANDLER_SEA", "FERRY_PORT_HANDLER_VIBESPRO", "FERRY_PORT_HANDLER_MODULE_F",
    "FERRY_PORT_HANDLER_MODULE_G", "FERRY_PORT_HANDLER_MODULE_H",
    "FERRY_PORT_CON_SEA__FROM_VIBESPRO", "FERRY_PORT_CON_VIBESPRO__FROM_SEA",
    "FERRY_PORT_CON_CG_F_INGEST", "FERRY_PORT_CON_CG_G_ARCHIVE", "FERRY_PORT_CON_CG_H_PUBLISH",
    "FERRY_PORT_CON_CG_REPLAY",
    "FERRY_PORT_DLQ_ROUTER_SEA_VIBESPRO", "FERRY_PORT_DLQ_ROUTER_MEDIATION",
    "FERRY_PORT_DLQ_REPLAYER_SEA_VIBESPRO", "FERRY_PORT_DLQ_REPLAYER_MEDIATION",
    "FERRY_PORT_CONSOLE_SEA_VIBESPRO", "FERRY_PORT_CONSOLE_MEDIATION",
    "FERRY_PORT_RETENTION_SEA_VIBESPRO", "FERRY_PORT_RETENTION_MEDIATION",
)  # fmt: skip
#: No proxies: an http_proxy in the environment must not intercept 127.0.0.1 probes.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: Topologies the stack runs (supervisord.conf has their programs).
STACK_TOPOLOGIES = ("topologies/sea-vibespro.yaml", "topologies/mediation.yaml")
#: How long programs get to reach RUNNING (and bootstrap to finish).
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class PostgresChoice:
    """Which PostgreSQL the stack runs: ``bin_dir`` (None: the embedded wheel's) and, when
    it runs without TLS, why (``plaintext``)."""

    bin_dir: Path | None
    plaintext: str = ""


def choose_postgres(var_dir: Path) -> PostgresChoice:
    """The system's PostgreSQL built with TLS (Debian's, ``./dev setup`` installs it) runs
    the stack's database over TLS; without one, or when ``<var>/pg/data`` was created by
    another major version, the embedded server runs it in plaintext (its build has no
    TLS), and the reason is printed."""
    system = system_postgres()
    made_by = cluster_major(var_dir / "pg" / "data")
    if system is None:
        return PostgresChoice(
            None,
            "no PostgreSQL built with TLS on this machine (./dev setup installs Debian's "
            "postgresql-15); the embedded server runs without TLS",
        )
    if made_by is not None and made_by != server_major(system):
        return PostgresChoice(
            None,
            f"{var_dir / 'pg' / 'data'} was made by PostgreSQL {made_by}, without TLS; "
            "remove the directory (its data is lost) to run PostgreSQL over TLS",
        )
    return PostgresChoice(system)


def _arguments(*parts: object) -> str:
    """Command-line arguments for supervisord.conf to expand (each shell-quoted)."""
    return " ".join(shlex.quote(str(part)) for part in parts)


def stack_environment(
    var_dir: Path,
    cluster_url: str | None = None,
    *,
    tls: StackTLS | None = None,
    pg: PostgresChoice | None = None,
) -> dict[str, str]:
    """The environment supervisord and every program inherit; with ``cluster_url`` (the
    seed list of a JetStream cluster the stack started) the single nats-server stays down
    and streams keep the topology's replicas. With ``tls`` every hop of the stack's own
    servers runs TLS (NATS; PostgreSQL when ``pg`` is a server built with it); the handler
    services and consoles always serve HTTPS with its certificates."""
    env = dict(os.environ)
    for name in PORT_VARS:
        env.setdefault(name, str(free_port()))
    external = "FERRY_NATS_URL" in os.environ and "FERRY_DSN_TEMPLATE" in os.environ
    own_nats = "FERRY_NATS_URL" not in os.environ or cluster_url is not None
    own_pg = "FERRY_DSN_TEMPLATE" not in os.environ
    env.update(
        FERRY_VAR=str(var_dir),
        FERRY_PYTHON=sys.executable,
        FERRY_EMBEDDED="false" if external else "true",
        FERRY_EMBEDDED_NATS="false" if external or cluster_url else "true",
        FERRY_TLS_DIR=str(var_dir / "tls"),
        FERRY_NATS_SERVER_ARGS="",
        FERRY_PG_SERVER_ARGS="",
        FERRY_PG_TLS_QUERY=env.get("FERRY_PG_TLS_QUERY", ""),
        PYTHONPATH=str(ROOT),
    )
    if cluster_url is not None:
        env["FERRY_NATS_URL"] = cluster_url
        env["FERRY_MAX_STREAM_REPLICAS"] = "3"
    scheme = "nats"
    if tls is not None and own_nats:
        scheme = "tls"
        env["FERRY_NATS_TLS_CA"] = str(tls.ca)
        env["FERRY_NATS_SERVER_ARGS"] = _arguments(
            "--tls-cert", tls.nats.cert, "--tls-key", tls.nats.key, "--tls-ca", tls.ca
        )
    env.setdefault("FERRY_NATS_URL", f"{scheme}://127.0.0.1:{env['FERRY_NATS_PORT']}")
    admin_query = ""
    if pg is not None and own_pg:
        if pg.bin_dir is not None:
            env["FERRY_PG_SERVER_ARGS"] = _arguments("--bin-dir", pg.bin_dir)
        if tls is not None and not pg.plaintext:
            env["FERRY_PG_SERVER_ARGS"] += " " + _arguments(
                "--tls-cert", tls.postgres.cert, "--tls-key", tls.postgres.key, "--tls-ca", tls.ca
            )
            env["FERRY_PG_TLS_QUERY"] = f"&sslmode=verify-full&sslrootcert={tls.ca}"
            admin_query = f"?sslmode=verify-full&sslrootcert={tls.ca}"
    env.setdefault(
        "FERRY_DSN_TEMPLATE",
        f"postgresql://postgres@127.0.0.1:{env['FERRY_PG_PORT']}/{{database}}{admin_query}",
    )
    # Each program's own login is built on this (supervisord.conf, FERRY_DSN_TEMPLATE).
    env["FERRY_PG_HOSTPORT"] = hostport(env["FERRY_DSN_TEMPLATE"])
    env.setdefault("FERRY_MAX_STREAM_REPLICAS", "1")
    env.setdefault("FERRY_MAX_STREAM_BYTES", "1GB")
    return env


def _secret_name(name: str) -> bool:
    """Settings whose values must never be written out (their *_FILE paths may be)."""
    return any(word in name for word in ("SECRET", "PASSWORD", "TOKEN")) and not name.endswith(
        "_FILE"
    )


def prepare_var_dir(var_dir: Path) -> None:
    """Create the var directory; PostgreSQL's unprivileged user must be able to enter it."""
    (var_dir / "log").mkdir(parents=True, exist_ok=True)
    (var_dir / "pg").mkdir(exist_ok=True)
    if os.geteuid() == 0:
        var_dir.chmod(0o711)
        (var_dir / "pg").chmod(0o711)


def supervisorctl(env: dict[str, str], *args: str, timeout: float = 30.0) -> str:
    """Run supervisorctl against our supervisord; return its output."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervisor.supervisorctl",
            "-c",
            str(ROOT / "supervisord.conf"),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result.stdout


def program_states(env: dict[str, str]) -> dict[str, str]:
    """{program: STATE} from ``supervisorctl status``."""
    states = {}
    for line in supervisorctl(env, "status").splitlines():
        parts = line.split()
        if len(parts) >= 2:
            states[parts[0]] = parts[1]
    return states


#: Programs that start with supervisord; every role waits for bootstrap (autostart=false).
SERVERS = ("nats-server", "postgres", "bootstrap")


def start_roles(env: dict[str, str], states: dict[str, str]) -> None:
    """Start the roles that have not started: only once bootstrap has created their logins,
    databases and streams can they connect with their own credentials."""
    waiting = sorted(k for k, v in states.items() if v == "STOPPED" and k not in SERVERS)
    if waiting:
        # supervisorctl starts them one after another, each waiting out its startsecs.
        supervisorctl(env, "start", *waiting, timeout=START_TIMEOUT)


def wait_until_up(env: dict[str, str], supervisord: subprocess.Popen[bytes]) -> dict[str, str]:
    """Wait until bootstrap EXITED and every other program is RUNNING; fail loudly otherwise."""
    deadline = time.monotonic() + START_TIMEOUT
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        if supervisord.poll() is not None:
            raise SystemExit(
                f"supervisord exited with {supervisord.returncode}; see {env['FERRY_VAR']}/log"
            )
        states = program_states(env)
        if states.get("bootstrap") in ("FATAL", "BACKOFF"):
            raise SystemExit(f"bootstrap failed; see {env['FERRY_VAR']}/log/bootstrap.log")
        others = {k: v for k, v in states.items() if k != "bootstrap"}
        embedded = env["FERRY_EMBEDDED"] == "true"
        if env.get("FERRY_EMBEDDED_NATS", env["FERRY_EMBEDDED"]) != "true":
            others.pop("nats-server", None)  # external NATS, or the stack's own cluster
        if states.get("bootstrap") == "EXITED":
            start_roles(env, others)
        if states.get("bootstrap") == "EXITED" and all(
            v == "RUNNING" or (not embedded and k in ("nats-server", "postgres"))
            for k, v in others.items()
        ):
            wait_until_ready(env, deadline)
            return states
        time.sleep(0.5)
    raise SystemExit(f"stack did not come up within {START_TIMEOUT}s: {states}")


def wait_until_ready(env: dict[str, str], deadline: float) -> None:
    """Wait until every role answers 200 on /readyz (connected, bound), not merely runs."""
    ports = {
        name: env[name]
        for name in PORT_VARS
        if name.startswith(
            ("FERRY_PORT_PUB_", "FERRY_PORT_CON_", "FERRY_PORT_DLQ_", "FERRY_PORT_CONSOLE_")
        )
    }
    waiting = dict(ports)
    trust = ssl.create_default_context(cafile=str(Path(env["FERRY_TLS_DIR"]) / "ca.crt"))
    while waiting and time.monotonic() < deadline:
        for name, port in list(waiting.items()):
            # The consoles answer on their HTTPS port; every other role's health port is
            # plain HTTP (README "Security": health and metrics stay on a port of their own).
            console = name.startswith("FERRY_PORT_CONSOLE_")
            scheme = "https" if console else "http"
            if _ready(f"{scheme}://127.0.0.1:{port}/readyz", trust if console else None):
                del waiting[name]
        if waiting:
            time.sleep(0.3)
    if waiting:
        raise SystemExit(f"not ready within {START_TIMEOUT}s: {', '.join(sorted(waiting))}")


def _ready(url: str, trust: ssl.SSLContext | None = None) -> bool:
    opener = _HTTP
    if trust is not None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=trust)
        )
    try:
        with opener.open(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def print_banner(env: dict[str, str], states: dict[str, str], plaintext: str = "") -> None:
    """Tell the user where everything is."""
    print("Ferry is up.")
    print(f"  NATS        {env['FERRY_NATS_URL']}")
    print(f"  PostgreSQL  {env['FERRY_DSN_TEMPLATE']}")
    print(f"  logs        {env['FERRY_VAR']}/log/")
    print(f"  control     {sys.executable} -m supervisor.supervisorctl -c supervisord.conf status")
    for topology in ("sea-vibespro", "mediation"):
        port = env[f"FERRY_PORT_CONSOLE_{topology.upper().replace('-', '_')}"]
        print(f"  console     https://127.0.0.1:{port}/  ({topology})")
    nats_tls = "tls://" in env["FERRY_NATS_URL"] or bool(env.get("FERRY_NATS_TLS_CA"))
    pg_tls = "sslmode=verify-full" in env["FERRY_DSN_TEMPLATE"] + env["FERRY_PG_TLS_QUERY"]
    hops = {"NATS": nats_tls, "PostgreSQL": pg_tls, "handler calls": True, "consoles": True}
    on = ", ".join(name for name, tls in hops.items() if tls)
    print(f"  TLS         {on} (the stack's CA: {env['FERRY_TLS_DIR']}/ca.crt)")
    for name, tls in hops.items():
        if not tls:
            why = plaintext if name == "PostgreSQL" and plaintext else "the server given"
            print(f"  plaintext   {name}: {why}")
    secrets = Path(env["FERRY_VAR"]) / "secrets"
    print(
        "              sign in as operator (password in "
        f"{secrets / 'console-password-operator'}) or viewer, read-only "
        f"({secrets / 'console-password-viewer'})"
    )
    for name, state in sorted(states.items()):
        print(f"    {name:34} {state}")


def print_consoles(env: dict[str, str]) -> None:
    """Where the consoles are (after the demo, with --keep)."""
    print("The stack stays up (--keep); look at what the demo did in the consoles:")
    for topology in ("sea-vibespro", "mediation"):
        port = env[f"FERRY_PORT_CONSOLE_{topology.upper().replace('-', '_')}"]
        print(f"  console     https://127.0.0.1:{port}/  ({topology})")


def start_cluster(var_dir: Path, topologies: list[Topology], tls: StackTLS) -> NatsCluster:
    """``--cluster``: a 3-node JetStream cluster under ``<var>/nats-cluster``, every node
    authorizing the stack's users (its config written 0600), clients and routes on TLS,
    started and ready (a meta leader, JetStream current)."""
    access = DevAccess.create(topologies, secrets_of(var_dir).root)
    route = RouteTLS(tls.nats.cert, tls.nats.key, tls.ca)
    cluster = NatsCluster(
        var_dir / "nats-cluster",
        access=access,
        extra=tls_block(tls.nats.cert, tls.nats.key, tls.ca),
        route_tls=[route] * CLUSTER_SIZE,
    )
    print(f"==> starting a {cluster.size}-node JetStream cluster")
    cluster.start()
    return cluster


def up(
    var_dir: Path,
    *,
    demo: bool,
    demo_args: list[str],
    keep: bool = False,
    cluster: bool = False,
) -> int:
    """Start the stack; run the demo or wait; always shut down cleanly. With ``keep`` the
    stack stays up after the demo until Ctrl-C (the consoles show what it did). With
    ``cluster`` NATS is a 3-node JetStream cluster (streams at 3 replicas) instead of one
    server; every role connects with its seed list."""
    check_var_dir(var_dir)
    prepare_var_dir(var_dir)
    topologies = [load_topology(ROOT / path) for path in STACK_TOPOLOGIES]
    write_handler_secrets(var_dir, topologies)
    write_role_credentials(var_dir, topologies)
    write_console_accounts(var_dir)
    tls = stack_certificates(var_dir / "tls")
    nodes = start_cluster(var_dir, topologies, tls) if cluster else None
    try:
        return _up(var_dir, demo=demo, demo_args=demo_args, keep=keep, cluster=nodes, tls=tls)
    finally:
        if nodes is not None:
            nodes.stop()


def _up(
    var_dir: Path,
    *,
    demo: bool,
    demo_args: list[str],
    keep: bool,
    cluster: NatsCluster | None,
    tls: StackTLS,
) -> int:
    pg = choose_postgres(var_dir)
    url = None if cluster is None else cluster.url.replace("nats://", "tls://")
    env = stack_environment(var_dir, url, tls=tls, pg=pg)
    # The operator's shell (stack.env) and the demo act as the NATS admin; the programs
    # never inherit it: each gets its own role's user in supervisord.conf.
    operator = {**env, **admin_nats_env(var_dir)}
    (var_dir / "stack.env").write_text(
        "".join(
            f"export {k}={v}\n"
            for k, v in sorted(operator.items())
            if k.startswith("FERRY_") and not _secret_name(k)
        )
    )
    # supervisord's own start-up errors (a bad config) land here, not in its log file.
    with open(var_dir / "log" / "supervisord.out", "ab") as out:
        supervisord = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(ROOT / "supervisord.conf")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        print_banner(env, wait_until_up(env, supervisord), pg.plaintext)
        if demo:
            from devstack.demo import run_demo

            code = int(run_demo(operator, demo_args))
            if not keep:
                return code
            print_consoles(env)
        print("Press Ctrl-C to stop.")
        while supervisord.poll() is None:
            time.sleep(1.0)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shutdown(supervisord, env)


def shutdown(supervisord: subprocess.Popen[bytes], env: dict[str, str] | None = None) -> None:
    """Stop every program (:func:`stop_programs`), then SIGTERM supervisord (it stops what
    is left, if anything, in priority order) and wait."""
    if supervisord.poll() is None:
        print("stopping the stack ...")
        if env is not None:
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: supervisord's turn
                stop_programs(env)
        supervisord.send_signal(signal.SIGTERM)
        try:
            supervisord.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(supervisord.pid, signal.SIGKILL)
            supervisord.wait(timeout=10)
    print("stopped.")


def stop_programs(env: dict[str, str]) -> None:
    """Stop every program a priority at a time, the highest first (the servers last), as
    supervisord's own shutdown does, but each priority's programs side by side: supervisord
    takes one program per turn of its one-second loop, stopped or not (half a minute for
    the stack's 30 programs), and exits at once when none is left running."""
    config = configparser.RawConfigParser()
    config.read(ROOT / "supervisord.conf")
    priority = {
        section.split(":", 1)[1]: config.getint(section, "priority", fallback=999)
        for section in config.sections()
        if section.startswith("program:")
    }
    transport = SupervisorTransport(None, None, f"unix://{env['FERRY_VAR']}/supervisor.sock")
    rpc = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
    try:
        for level in sorted(set(priority.values()), reverse=True):
            names = {name for name, p in priority.items() if p == level}
            for name in sorted(names):
                with contextlib.suppress(xmlrpc.client.Fault):  # not running: nothing to stop
                    rpc.supervisor.stopProcess(name, False)
            deadline = time.monotonic() + 60  # past every program's stopwaitsecs
            while time.monotonic() < deadline and names & _stopping(rpc):
                time.sleep(0.1)
    except (OSError, xmlrpc.client.Error):
        pass  # supervisord is not answering: its own shutdown stops what is left
    finally:
        transport.close()


def _stopping(rpc: xmlrpc.client.ServerProxy) -> set[str]:
    infos = cast(list[dict[str, Any]], rpc.supervisor.getAllProcessInfo())
    return {info["name"] for info in infos if info["statename"] == "STOPPING"}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m devstack.stack")
    sub = parser.add_subparsers(dest="command", required=True)
    up_cmd = sub.add_parser("up", help="start the platform under supervisord")
    up_cmd.add_argument("--demo", action="store_true", help="drive the demo workload, then stop")
    up_cmd.add_argument("--var-dir", type=Path, default=ROOT / ".var", help="data and logs")
    up_cmd.add_argument(
        "--keep", action="store_true", help="after the demo, stay up until Ctrl-C (the consoles)"
    )
    up_cmd.add_argument(
        "--cluster",
        action="store_true",
        help="NATS as a 3-node JetStream cluster (streams at 3 replicas, roles on its seed list)",
    )
    args, rest = parser.parse_known_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    return up(
        args.var_dir.resolve(),
        demo=args.demo,
        demo_args=rest,
        keep=args.keep,
        cluster=args.cluster,
    )


if __name__ == "__main__":
    sys.exit(main())
