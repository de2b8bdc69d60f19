"""``python -m k8s.secrets --output FILE [TOPOLOGY ...]``: every Secret the manifests mount.

The manifests (``k8s/generate.py``) never hold a secret: each pod mounts its role's Secret
``ferry-role-<role>``, the provisioning Job ``ferry-admin`` and nats-server
``ferry-nats-users``. This command renders all of them, generated the way the dev stack
generates its credentials (``devstack/credentials.py``, ``devstack/secrets.py``): a random
password per role, kept in ``VAR/secrets`` (directory 0700, files 0600, the shape of a
mounted Secret), so rendering again gives the same values and rotating one means deleting
its file. Put your own values there first to use them (e.g. the PostgreSQL
administrator's password in ``pg-password-<admin>``).

Secrets rendered (``--namespace``, default ``ferry-dev``):

``ferry-role-<role>``   one per role of every topology (publishers, consumers, dlq roles,
                        handlers, producers, KPI job): ``pgpass`` (its own login only),
                        ``nats-password`` (roles that use NATS), ``handler-secret``
                        (consumers: the durable's signing secret), ``handler-secrets.json``
                        (handler services: the secrets of the durables that call them)
``ferry-admin``         the provisioning Job's: ``nats-password`` (``ferry-admin``),
                        ``pgpass`` (the administrator and the owner ``ferry_owner``) and
                        ``pg-password-<login>`` of every login (``ferry db-roles
                        --passwords-dir``)
``ferry-nats-users``    nats-server's environment, ``FERRY_NATS_PASSWORD_<USER>`` per user
                        (in ``--nats-namespace``: the Helm release's namespace)
``postgres-dev``        with ``--dev``: the dev PostgreSQL's superuser password
``ferry-pg-owner``      with ``--cnpg``: the owner's login for CloudNativePG's managed role

The file is written readable by its owner only; nothing secret is printed. Apply it with
``kubectl apply --server-side -f FILE`` (server-side apply keeps no copy of the data in a
``last-applied-configuration`` annotation). Exit codes: 0 written, 2 configuration error.
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from devstack.credentials import secrets_of, write_role_credentials
from devstack.secrets import durable_secret_file, handler_secrets_file, write_handler_secrets
from k8s import generate, pods
from shared.access.identities import DB_OWNER, NATS_ADMIN, Identity, identities, write_private
from shared.access.nats_auth import nats_users, password_variable
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VAR = ROOT / ".var" / "k8s"
#: The dev overlay's PostgreSQL superuser; the provisioning Job's administrator by default.
DEFAULT_PG_ADMIN = "postgres"

Doc = dict[str, Any]


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def _secret(name: str, namespace: str, data: dict[str, str], *, kind: str = "Opaque") -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ferry"},
        },
        "type": kind,
        "data": {key: _b64(value) for key, value in sorted(data.items())},
    }


def _pgpass_field(value: str) -> str:
    """A libpq password-file field: ``\\`` and ``:`` escaped."""
    return value.replace("\\", "\\\\").replace(":", "\\:")


class Credentials:
    """The credentials of ``topologies`` kept in ``var_dir/secrets`` (created when missing)."""

    def __init__(self, var_dir: Path, topologies: Sequence[Topology], pg_admin: str) -> None:
        self.var_dir, self.topologies, self.pg_admin = var_dir, list(topologies), pg_admin
        write_role_credentials(var_dir, self.topologies)
        write_handler_secrets(var_dir, self.topologies)
        self.files = secrets_of(var_dir)
        self.files.ensure(self.files.pg_password_file(pg_admin))

    def pg_password(self, name: str) -> str:
        return self.files.read(self.files.pg_password_file(name))

    def role_data(self, identity: Identity) -> dict[str, str]:
        """The keys of ``identity``'s Secret (:func:`k8s.pods.secret_keys`)."""
        data = {pods.PGPASS: self.files.pgpass_file(identity.name).read_text()}
        if identity.uses_nats:
            data[pods.NATS_PASSWORD] = self.files.read(self.files.nats_password_file(identity.name))
        if identity.kind == "inbox-consumer":
            data[pods.HANDLER_SECRET] = self.files.read(
                durable_secret_file(self.var_dir, identity.of)
            )
        if identity.kind == "handler":
            data[pods.HANDLER_SECRETS] = self.files.read(
                handler_secrets_file(self.var_dir, identity.of)
            )
        if identity.kind == "console":
            # No account until an operator adds one (hashes: `python -m services.console
            # hash-password`); the token (read-only) and the session key are random.
            data[pods.CONSOLE_ACCOUNTS] = "{}\n"
            for key in (pods.CONSOLE_TOKEN, pods.CONSOLE_SESSION_KEY):
                data[key] = self.files.ensure(self.files.root / f"{key}-{identity.name}")
        assert tuple(data) == pods.secret_keys(identity), identity
        return data

    def admin_data(self) -> dict[str, str]:
        """The provisioning Job's Secret (:func:`k8s.pods.admin_secret_keys`)."""
        admin = ":".join(["*", "*", "*", _pgpass_field(self.pg_admin),
                          _pgpass_field(self.pg_password(self.pg_admin))])  # fmt: skip
        owner = f"*:*:*:{DB_OWNER}:{_pgpass_field(self.pg_password(DB_OWNER))}"
        data = {
            pods.NATS_PASSWORD: self.files.read(self.files.nats_password_file(NATS_ADMIN)),
            pods.PGPASS: f"{admin}\n{owner}\n",
        }
        names = sorted({i.name for t in self.topologies for i in identities(t)})
        for name in [DB_OWNER, *names]:
            data[pods.admin_password_key(name)] = self.pg_password(name)
        assert set(data) == set(pods.admin_secret_keys(self.topologies))
        return data

    def nats_server_data(self) -> dict[str, str]:
        """nats-server's environment: ``FERRY_NATS_PASSWORD_<USER>`` of every user."""
        return {
            password_variable(user): self.files.read(self.files.nats_password_file(user))
            for user in nats_users(self.topologies)
        }


def render(
    topologies: Sequence[Topology],
    var_dir: Path,
    *,
    namespace: str = "ferry-dev",
    nats_namespace: str | None = None,
    pg_admin: str = DEFAULT_PG_ADMIN,
    dev: bool = False,
    cnpg: bool = False,
) -> list[Doc]:
    """Every Secret of ``topologies`` (see the module doc), from ``var_dir/secrets``."""
    credentials = Credentials(var_dir, topologies, pg_admin)
    docs = [
        _secret(pods.role_secret(identity), namespace, credentials.role_data(identity))
        for topology in topologies
        for identity in identities(topology)
    ]
    docs.append(_secret(pods.ADMIN_SECRET, namespace, credentials.admin_data()))
    docs.append(
        _secret(pods.NATS_USERS_SECRET, nats_namespace or namespace, credentials.nats_server_data())
    )
    if dev:
        password = credentials.pg_password(pg_admin)
        docs.append(_secret("postgres-dev", namespace, {"POSTGRES_PASSWORD": password}))
    if cnpg:
        owner = {"username": DB_OWNER, "password": credentials.pg_password(DB_OWNER)}
        docs.append(_secret("ferry-pg-owner", namespace, owner, kind="kubernetes.io/basic-auth"))
    return docs


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m k8s.secrets",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The Secrets are written to --output (0600); no value is ever printed.",
    )
    parser.add_argument("topologies", nargs="*", type=Path, help="topology files (default: both)")
    parser.add_argument(
        "--output", type=Path, required=True, help="the Secrets' YAML, written 0600"
    )
    parser.add_argument(
        "--var-dir", type=Path, default=DEFAULT_VAR,
        help="keeps the passwords in VAR/secrets (default: .var/k8s)",
    )  # fmt: skip
    parser.add_argument("--namespace", default="ferry-dev", help="namespace of Ferry's Secrets")
    parser.add_argument(
        "--nats-namespace", help="namespace of ferry-nats-users (default: --namespace)"
    )
    parser.add_argument(
        "--pg-admin", default=DEFAULT_PG_ADMIN,
        help="PostgreSQL administrator the provisioning Job runs `ferry db-roles` as "
        "(ferry-settings PG_ADMIN_USER)",
    )  # fmt: skip
    parser.add_argument(
        "--dev", action="store_true", help="also the dev overlay's PostgreSQL superuser Secret"
    )
    parser.add_argument(
        "--cnpg", action="store_true", help="also ferry-pg-owner for k8s/examples/cnpg"
    )
    args = parser.parse_args(argv)
    paths = args.topologies or [ROOT / p for p in generate.DEFAULT_TOPOLOGIES]
    try:
        topologies = [load_topology(p) for p in paths]
        docs = render(
            topologies,
            args.var_dir.resolve(),
            namespace=args.namespace,
            nats_namespace=args.nats_namespace,
            pg_admin=args.pg_admin,
            dev=args.dev,
            cnpg=args.cnpg,
        )
    except ConfigurationError as exc:
        print(f"k8s.secrets: configuration error: {exc}", file=sys.stderr)
        return 2
    write_private(args.output, yaml.safe_dump_all(docs, sort_keys=False))
    names = ", ".join(sorted({d["metadata"]["namespace"] for d in docs}))
    print(
        f"wrote {args.output}: {len(docs)} Secrets in namespace {names} (passwords kept in "
        f"{args.var_dir}/secrets); apply with: kubectl apply --server-side -f {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
