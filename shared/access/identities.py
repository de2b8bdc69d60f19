"""Who is who: the process-role identities of a topology and where their secrets live.

Every process role of a topology gets an identity of its own, named like its program in
``supervisord.conf`` (``outbox-publisher-sea``, ``inbox-consumer-cg_f_ingest``,
``dlq-router-mediation``). The NATS user (:mod:`shared.access.nats_auth`) and the PostgreSQL
login (:mod:`shared.access.db_roles`) of a process are derived from it, so one name follows a
process from its supervisord program through its NATS connection to its database session.

Provisioning and migrations use separate administrative identities that no long-running
role holds: the NATS user :data:`NATS_ADMIN` and the PostgreSQL owner :data:`DB_OWNER`.
"""

from __future__ import annotations

import os
import re
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology
from shared.domain.errors import ConfigurationError

Kind = Literal[
    "outbox-publisher",
    "inbox-consumer",
    "dlq-router",
    "dlq-replayer",
    "handler",
    "producer",
    "kpi-spark-job",
    "retention",
    "console",
]

#: The NATS user of ``ferry provision`` and operator commands (all permissions).
NATS_ADMIN = "ferry-admin"
#: The PostgreSQL role that owns every Ferry table and runs ``ferry migrate``.
DB_OWNER = "ferry_owner"
#: Kinds that talk to NATS (handlers, producers, the KPI job and ``ferry purge``'s
#: ``retention`` login only use PostgreSQL; but the handler that runs replay jobs, see
#: :attr:`Identity.nats`).
NATS_KINDS: tuple[Kind, ...] = (
    "outbox-publisher", "inbox-consumer", "dlq-router", "dlq-replayer", "console",
)  # fmt: skip
#: PostgreSQL limits identifiers to 63 bytes.
_PG_NAME_MAX = 63
_PG_UNSAFE = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True, order=True)
class Identity:
    """One process role of a topology: ``kind`` of ``of`` (a context, durable or topology)."""

    kind: Kind
    of: str
    #: A role of a kind that never talks to NATS that does here: the handler that runs
    #: the replay API's jobs (:func:`shared.contracts.replay_jobs.replay_workers`).
    nats: bool = field(default=False, compare=False)

    @property
    def name(self) -> str:
        """``{kind}-{of}``: the supervisord program name and the NATS user name."""
        return f"{self.kind}-{self.of}"

    @property
    def pg_role(self) -> str:
        """The PostgreSQL login: ``ferry_`` + the name in lower snake case."""
        return pg_role_name(self.name)

    @property
    def uses_nats(self) -> bool:
        """Whether this role connects to NATS."""
        return self.kind in NATS_KINDS or self.nats


def pg_role_name(name: str) -> str:
    """``ferry_`` + ``name`` with every character PostgreSQL would need quoted replaced."""
    role = "ferry_" + _PG_UNSAFE.sub("_", name.lower())
    if len(role) > _PG_NAME_MAX:
        raise ConfigurationError(
            f"PostgreSQL role {role!r} is longer than {_PG_NAME_MAX} characters; "
            "shorten the context, durable or topology name"
        )
    return role


def handler_contexts(topology: Topology) -> list[str]:
    """Contexts that run a handler service: the targets of the topology's durables."""
    return sorted({d.target for d in topology.durables.values()})


def identities(topology: Topology) -> list[Identity]:
    """Every process role of ``topology``, in a stable order."""
    found: list[Identity] = []
    for name, ctx in sorted(topology.contexts.items()):
        if ctx.stream is not None:
            found.append(Identity("outbox-publisher", name))
            found.append(Identity("producer", name))
    found += [Identity("inbox-consumer", name) for name in sorted(topology.durables)]
    replaying = replay_workers(topology)
    found += [
        Identity("handler", name, nats=name in replaying) for name in handler_contexts(topology)
    ]
    found += [
        Identity("dlq-router", topology.name),
        Identity("dlq-replayer", topology.name),
        Identity("kpi-spark-job", topology.name),
        Identity("retention", topology.name),
        Identity("console", topology.name),
    ]
    return found


def identity_named(topologies: list[Topology], name: str) -> Identity:
    """The identity called ``name`` in any of ``topologies``; a clear error otherwise."""
    for topology in topologies:
        for identity in identities(topology):
            if identity.name == name:
                return identity
    known = sorted({i.name for t in topologies for i in identities(t)})
    raise ConfigurationError(f"no role called {name!r} (known: {', '.join(known)})")


def check_unique(topologies: list[Topology]) -> None:
    """Refuse topologies whose roles would share a name (one NATS server, one cluster)."""
    seen: dict[str, str] = {}
    for topology in topologies:
        for identity in identities(topology):
            other = seen.setdefault(identity.name, topology.name)
            if other != topology.name:
                raise ConfigurationError(
                    f"role {identity.name!r} exists in topologies {other!r} and "
                    f"{topology.name!r}; context, durable and topology names must differ"
                )


class SecretsDir:
    """A directory of one-secret-per-file credentials (what a mounted Kubernetes Secret
    looks like): ``nats-password-{name}``, ``pg-password-{name}`` and ``pgpass-{name}``.

    The directory is 0700 and every file 0600; values are never logged or printed.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def nats_password_file(self, name: str) -> Path:
        """The NATS password of the user ``name``."""
        return self.root / f"nats-password-{name}"

    def pg_password_file(self, name: str) -> Path:
        """The PostgreSQL password of the role identity ``name`` (or :data:`DB_OWNER`)."""
        return self.root / f"pg-password-{name}"

    def pgpass_file(self, name: str) -> Path:
        """A libpq password file holding only ``name``'s login (``?passfile=`` in a DSN)."""
        return self.root / f"pgpass-{name}"

    def read(self, path: Path) -> str:
        """The secret in ``path``; the error names the file, never its content."""
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(f"secret {path}: cannot read: {exc.strerror}") from exc
        if not value:
            raise ConfigurationError(f"secret {path} is empty")
        return value

    def ensure(self, path: Path) -> str:
        """The secret in ``path``, generated (see :func:`new_password`) when missing."""
        if not path.exists():
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(path, new_password())
        return self.read(path)


#: Letters and digits only: a password may be substituted unquoted into a nats-server
#: config (``$VAR``), where a leading digit, ``-`` or ``_`` makes the parser read a number
#: or fail ("Expected a top-level value to end ...").
_PASSWORD_ALPHABET = string.ascii_letters + string.digits


def new_password(length: int = 32) -> str:
    """A random password (about 190 bits at 32 characters) that starts with a letter."""
    first = secrets.choice(string.ascii_letters)
    return first + "".join(secrets.choice(_PASSWORD_ALPHABET) for _ in range(length - 1))


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only (0600) from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
