"""NATS users and subject permissions derived from the topology (least privilege per role).

Each NATS-using process role (:mod:`shared.access.identities`) gets one user whose permissions allow
exactly the subjects its nats-py calls use, and nothing else:

``outbox-publisher-{context}``
    publishes only into its context's namespace (``{namespace}.>``, e.g. ``sea.event.>``)
    and receives only its own PubAck replies.
``inbox-consumer-{durable}``
    pulls from, acks and reads the info of its own durable's consumers only
    (``$JS.API.CONSUMER.MSG.NEXT|INFO.{STREAM}.{consumer}``, ``$JS.ACK.{STREAM}.{consumer}.>``
    for the durable itself, or each partition's ``{durable}_p{k}`` under ``ordering: key``),
    reads its stream by sequence for the lag gauge (``$JS.API.STREAM.MSG.GET.{STREAM}``)
    and publishes its dead-letter subject.
``dlq-router-{topology}``
    pulls and acks the topology's advisory durable (``dlq_router``), reads the original
    messages of the topology's streams by sequence and publishes its dead-letter subjects;
    reads the info of the topology's durables (its sweep) and dead-letter streams (their
    max_msg_size).
``dlq-replayer-{topology}``
    publishes only the replay subjects of its topology's durables
    (``ferry.replay.{STREAM}.{durable}``, ``….{durable}.{k}`` for each partition of an
    ordered durable on a partitioned stream).
``handler-{context}`` of the context that runs the replay API's jobs (mediation: module_g)
    publishes the replay subjects, as the dlq-replayer does (every other handler has no
    NATS user).
``console-{topology}``
    the operator console: reads the info of the topology's streams (event, dead-letter
    and advisory streams) and consumers, reads messages of its event streams by sequence
    (``ferry where``), may create an *ephemeral* (unnamed) consumer on them to find an
    event no inbox row locates or to read the range of a rewind, and publishes the replay
    subjects (what ``ferry dlq replay`` and ``ferry durable rewind`` publish). It can
    neither create a named consumer nor change or delete one.

Replies: every client uses a private inbox prefix (``_INBOX.{user}``, see
:func:`~shared.domain.reply_subjects.inbox_prefix`) and may subscribe only there, so no
role can listen to another's replies (PubAcks, pulled messages). Provisioning and operator
commands use :data:`~shared.access.identities.NATS_ADMIN`, which no long-running role
holds; nothing else may create, change or delete a stream or a consumer.

``ferry nats-auth`` prints the ``authorization { users = [...] }`` block for nats-server:
with ``$FERRY_NATS_PASSWORD_<USER>`` references (the server reads them from its
environment, e.g. a Kubernetes Secret) or, with ``--passwords-dir``, with the passwords
themselves, into a file only its owner can read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from shared.access.identities import NATS_ADMIN, Identity, SecretsDir, check_unique, identities
from shared.access.streams import ROUTER_DURABLE
from shared.adapters.nats import NatsAuth
from shared.contracts.replay_jobs import replay_workers
from shared.contracts.topology import Topology
from shared.domain.reply_subjects import inbox_prefix


def password_variable(user: str) -> str:
    """The environment variable a nats-server config reads ``user``'s password from."""
    return "FERRY_NATS_PASSWORD_" + re.sub(r"[^A-Z0-9]", "_", user.upper())


@dataclass(frozen=True)
class Permissions:
    """What one NATS user may publish to and subscribe to (``allow`` lists; all else denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def as_dict(self) -> dict[str, list[str]]:
        """``{"publish": [...], "subscribe": [...]}``."""
        return {"publish": list(self.publish), "subscribe": list(self.subscribe)}


def _durable_api(stream: str, durable: str) -> list[str]:
    """Pull (fetch), info and acks of one durable: all a consumer of it needs."""
    return [
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _stream_read(stream: str) -> str:
    """``js.get_msg`` of one stream (by sequence, or the next one on a subject)."""
    return f"$JS.API.STREAM.MSG.GET.{stream}"


def _unique(subjects: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(subjects))


def permissions_of(identity: Identity, topology: Topology) -> Permissions | None:
    """The permissions of ``identity``; None for roles that never connect to NATS."""
    reply = (f"{inbox_prefix(identity.name)}.>",)
    if identity.kind == "outbox-publisher":
        return Permissions((f"{topology.contexts[identity.of].namespace}.>",), reply)
    if identity.kind == "inbox-consumer":
        spec = topology.durables[identity.of]
        publish = [
            *(
                subject
                for plan in topology.consumers(identity.of)
                for subject in _durable_api(spec.stream, plan.name)
            ),
            _stream_read(spec.stream),
            spec.dead_letter_subject,
        ]
        return Permissions(_unique(publish), reply)
    if identity.kind == "dlq-router":
        durables = sorted(topology.durables.items())
        publish = [
            *_durable_api(topology.advisory_stream, ROUTER_DURABLE),
            *sorted({_stream_read(spec.stream) for _, spec in durables}),
            *sorted({spec.dead_letter_subject for _, spec in durables}),
            # The sweep reads each durable's progress; records are sized to each
            # dead-letter stream's max_msg_size.
            *(
                f"$JS.API.CONSUMER.INFO.{spec.stream}.{plan.name}"
                for name, spec in durables
                for plan in topology.consumers(name)
            ),
            *(f"$JS.API.STREAM.INFO.{s.name}" for s in topology.dead_letter_streams),
        ]
        return Permissions(_unique(publish), reply)
    if identity.kind == "dlq-replayer":
        publish = [
            plan.replay_subject
            for name in sorted(topology.durables)
            for plan in topology.consumers(name)
        ]
        return Permissions(_unique(publish), reply)
    if identity.kind == "console":
        return Permissions(_unique(_console_publish(topology)), reply)
    if identity.kind == "handler" and identity.of in replay_workers(topology):
        # The replay API's worker (cg_replay's handler) replays as `ferry dlq replay` does.
        publish = [
            plan.replay_subject
            for name in sorted(topology.durables)
            for plan in topology.consumers(name)
        ]
        return Permissions(_unique(publish), reply)
    return None


def _console_publish(topology: Topology) -> list[str]:
    """What the operator console publishes: JetStream API reads, consumer pauses and the
    replay subjects."""
    durables = sorted(topology.durables.items())
    streams = sorted({spec.stream for _, spec in durables})
    every = [
        *streams,
        *(s.name for s in topology.dead_letter_streams),
        topology.advisory_stream,
    ]
    return [
        *(f"$JS.API.STREAM.INFO.{name}" for name in dict.fromkeys(every)),
        *(
            f"$JS.API.CONSUMER.{api}.{spec.stream}.{plan.name}"
            for name, spec in durables
            for plan in topology.consumers(name)
            # Its overview reads each consumer; its pause and resume buttons pause them.
            for api in ("INFO", "PAUSE")
        ),
        *(_stream_read(stream) for stream in streams),
        # `ferry where`'s scan: an ordered consumer (ephemeral: no name in the subject) and
        # its flow-control replies.
        *(f"$JS.API.CONSUMER.CREATE.{stream}" for stream in streams),
        *(f"$JS.FC.{stream}.>" for stream in streams),
        *(plan.replay_subject for name, _ in durables for plan in topology.consumers(name)),
    ]


def nats_users(topologies: list[Topology]) -> dict[str, Permissions | None]:
    """Every NATS user of ``topologies`` → its permissions (None: the admin, unrestricted)."""
    check_unique(topologies)
    users: dict[str, Permissions | None] = {NATS_ADMIN: None}
    for topology in topologies:
        for identity in identities(topology):
            permissions = permissions_of(identity, topology)
            if permissions is not None:
                users[identity.name] = permissions
    return users


#: How a user's password appears in the config: a quoted literal or a ``$VARIABLE``.
PasswordSource = Callable[[str], str]


def env_references(user: str) -> str:
    """``$FERRY_NATS_PASSWORD_<USER>``: nats-server substitutes its environment variable."""
    return "$" + password_variable(user)


def passwords_from(folder: SecretsDir, *, generate: bool) -> PasswordSource:
    """Literal passwords from ``folder`` (``nats-password-{user}``), created when missing."""

    def source(user: str) -> str:
        path = folder.nats_password_file(user)
        return json.dumps(folder.ensure(path) if generate else folder.read(path))

    return source


def _quoted(values: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def authorization_block(
    users: dict[str, Permissions | None], password: PasswordSource = env_references
) -> str:
    """The nats-server ``authorization { users = [...] }`` block for ``users``."""
    lines = [
        "# Generated by `ferry nats-auth` from the topology: one user per process role,",
        "# allowed only the subjects its job uses (README: Security). Do not edit by hand.",
        "authorization {",
        "  users = [",
    ]
    for user, permissions in users.items():
        lines.append("    {")
        lines.append(f"      user: {json.dumps(user)}")
        lines.append(f"      password: {password(user)}")
        if permissions is None:
            lines.append("      # administrative: provisioning and operator commands only")
        else:
            lines.append("      permissions: {")
            lines.append(f"        publish: {{allow: {_quoted(permissions.publish)}}}")
            lines.append(f"        subscribe: {{allow: {_quoted(permissions.subscribe)}}}")
            lines.append("      }")
        lines.append("    }")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DevAccess:
    """The users of a local nats-server (dev stack, tests) with passwords in a secrets dir."""

    secrets: SecretsDir
    users: dict[str, Permissions | None]
    #: The CA that verifies the server when it requires TLS (None: plaintext).
    tls_ca: Path | None = None

    @classmethod
    def create(
        cls, topologies: list[Topology], secrets_dir: Path, tls_ca: Path | None = None
    ) -> DevAccess:
        """Users of ``topologies`` plus the admin; missing passwords are generated."""
        access = cls(SecretsDir(secrets_dir), nats_users(topologies), tls_ca)
        for user in access.users:
            access.secrets.ensure(access.secrets.nats_password_file(user))
        return access

    def config(self) -> str:
        """The authorization block with the literal passwords (write it 0600)."""
        return authorization_block(self.users, passwords_from(self.secrets, generate=False))

    def password_file(self, user: str) -> Path:
        """Where ``user``'s password is kept."""
        if user not in self.users:
            raise KeyError(f"no NATS user {user!r} on this server")
        return self.secrets.nats_password_file(user)

    def password(self, user: str) -> str:
        """``user``'s password (for an in-process client)."""
        return self.secrets.read(self.password_file(user))

    def env(self, user: str = NATS_ADMIN) -> dict[str, str]:
        """The ``FERRY_NATS_USER`` / ``FERRY_NATS_PASSWORD_FILE`` (and with TLS the
        ``FERRY_NATS_TLS_CA``) a process of ``user`` gets."""
        env = {"FERRY_NATS_USER": user, "FERRY_NATS_PASSWORD_FILE": str(self.password_file(user))}
        if self.tls_ca is not None:
            env["FERRY_NATS_TLS_CA"] = str(self.tls_ca)
        return env

    def auth(self, user: str = NATS_ADMIN) -> NatsAuth:
        """Credentials of ``user`` (and the CA, with TLS) for an in-process client."""
        return NatsAuth(user=user, password=self.password(user), tls_ca=self.tls_ca)
