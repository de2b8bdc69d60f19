"""Runtime settings, read from the environment (prefix ``FERRY_``) and nothing else.

One class per role, each built from :class:`CommonSettings`. This module is the only
place in Ferry that reads ``os.environ`` (through pydantic-settings), but for
``FERRY_REGISTRY``, which :mod:`shared.contracts.events` also reads so that the producer
API of a service that builds no Ferry settings follows it too. Every field is
documented in docs/reference/settings.md, generated from the ``#:`` comments here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.access.streams import Caps
from shared.adapters.nats import NatsAuth
from shared.contracts.layout import DEFAULT_TOPOLOGY
from shared.contracts.loading import load_topology
from shared.contracts.topology import Topology
from shared.domain import policy
from shared.domain.durations import parse_size
from shared.domain.errors import ConfigurationError
from shared.domain.ordering import ORDERED_PULL_LIFETIME

#: Default DSN template: ``{database}`` is replaced by the context's database name.
DEFAULT_DSN_TEMPLATE = "postgresql://postgres@127.0.0.1:5432/{database}"
#: A default partition lease outlasts ``ack_wait`` plus an ordered partition's pull
#: request lifetime by this (a second of margin and about five to work between renewals).
DEFAULT_LEASE_SLACK = 6.0


def read_secret(value: SecretStr | None, path: Path | None, name: str) -> bytes | None:
    """A secret from its ``*_FILE`` (trailing newline stripped) or its variable, or None.

    Errors name the setting and the file, never the content.
    """
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigurationError(f"{name}_FILE {path}: cannot read: {exc.strerror}") from exc
        if not text:
            raise ConfigurationError(f"{name}_FILE {path} is empty")
        return text.encode()
    if value is not None:
        if not value.get_secret_value():
            raise ConfigurationError(f"{name} is set but empty")
        return value.get_secret_value().encode()
    return None


class CommonSettings(BaseSettings):
    """Settings every role shares."""

    # populate_by_name: fields read from several variables (FERRY_*, then OTEL_*) can
    # still be given by field name in code.
    model_config = SettingsConfigDict(env_prefix="FERRY_", extra="ignore", populate_by_name=True)

    #: Path of the topology file; unset: Ferry's ``topologies/sea-vibespro.yaml``, found
    #: from Ferry's installation (never from the working directory).
    topology: Path = DEFAULT_TOPOLOGY
    #: Registry file (JSON, written by ``ferry registry generate --manifests DIR --out FILE``)
    #: holding the events, schemas and handlers of the topologies this process serves; unset:
    #: the registry Ferry ships, compiled from its own manifests. Read once, at start.
    registry: Path | None = None
    #: NATS server URLs, comma-separated: a cluster's seed list (``nats://n1:4222,nats://n2:4222,
    #: nats://n3:4222``). The client connects to one of them that answers and, when that server
    #: goes away, reconnects to another of the list.
    nats_url: str = "nats://127.0.0.1:4222"
    #: Per-database DSNs as JSON, e.g. ``{"sea": "postgresql://..."}``; wins over the template.
    #: A DSN may name a primary and its standbys with ``target_session_attrs=read-write``:
    #: ``postgresql://u@pg1:5432,pg2:5432/sea?target_session_attrs=read-write`` connects to
    #: the one that is writable (after a failover, the promoted standby).
    databases: dict[str, str] = Field(default_factory=dict)
    #: DSN for any database not listed in ``databases`` (several servers allowed, as there).
    dsn_template: str = DEFAULT_DSN_TEMPLATE
    #: Caps every stream's replicas (1 for a single dev server; unset in production).
    max_stream_replicas: int | None = None
    #: Caps every stream's max_bytes, e.g. "1GB" (JetStream reserves it; unset in production).
    max_stream_bytes: str | None = None

    def stream_caps(self) -> Caps:
        """The caps provisioning applies over the topology."""
        try:
            size = None if self.max_stream_bytes is None else parse_size(self.max_stream_bytes)
        except ValueError as exc:
            raise ConfigurationError(f"FERRY_MAX_STREAM_BYTES: {exc}") from None
        return Caps(max_replicas=self.max_stream_replicas, max_bytes=size)

    #: Port of /healthz, /readyz (0 or unset: no HTTP health endpoint).
    health_port: int | None = None
    #: Interface the health endpoint binds.
    health_host: str = "127.0.0.1"
    #: Log level name.
    log_level: str = "INFO"
    #: Seconds between client PINGs; a dead link is noticed after ~3 missed ones.
    nats_ping_interval: float = 2.0
    # NATS credentials and TLS (docs/explanation/security.md). Each role has its own user;
    # the password comes from the variable or, better, from a file (a mounted Kubernetes Secret).
    #: NATS user name (the role's identity, e.g. ``outbox-publisher-sea``); unset: anonymous.
    nats_user: str | None = None
    #: Password of ``nats_user``.
    nats_password: SecretStr | None = None
    #: File holding the password instead; wins when both are set.
    nats_password_file: Path | None = None
    #: NATS ``.creds`` file (JWT + nkey seed, operator mode) instead of user/password.
    nats_creds_file: Path | None = None
    #: File holding an nkey seed (``SU...``) instead of user/password.
    nats_nkey_seed_file: Path | None = None
    #: CA bundle that verifies the NATS server (TLS); unset: the system CAs.
    nats_tls_ca: Path | None = None
    #: Client certificate and key for mutual TLS.
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    #: Start TLS before the server speaks (server option ``handshake_first``): no downgrade.
    nats_tls_handshake_first: bool = False

    # Telemetry (shared/telemetry/, shared/runtime/metrics.py). Each falls back to
    # the standard OpenTelemetry variable; the OTLP exporters read OTEL_EXPORTER_OTLP_* themselves.
    #: Span exporters, comma-separated: none (tracing off, no cost), otlp, file, console.
    traces_exporter: str = Field(
        default="none",
        validation_alias=AliasChoices("FERRY_TRACES_EXPORTER", "OTEL_TRACES_EXPORTER"),
    )
    #: OTLP transport: grpc or http/protobuf (the OpenTelemetry default).
    otlp_protocol: str = Field(
        default="http/protobuf",
        validation_alias=AliasChoices(
            "FERRY_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    )
    #: OTLP base URL (http/protobuf appends /v1/traces); unset: the SDK reads
    #: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else localhost:4317 / localhost:4318.
    otlp_endpoint: str | None = Field(
        default=None, validation_alias=AliasChoices("FERRY_OTLP_ENDPOINT")
    )
    #: OTLP/HTTP: encode spans with Ferry's encoder (shared/telemetry/otlp_wire.py, about
    #: four times faster, checked against OpenTelemetry's own at start); false: theirs.
    otlp_fast_encoding: bool = Field(
        default=True, validation_alias=AliasChoices("FERRY_OTLP_FAST_ENCODING")
    )
    #: File the ``file`` exporter appends spans to, one JSON object per line.
    traces_file: Path = Field(
        default=Path("ferry-traces.jsonl"), validation_alias=AliasChoices("FERRY_TRACES_FILE")
    )
    #: Sampler of new traces: parentbased_traceidratio, parentbased_always_on, always_on,
    #: traceidratio, always_off, parentbased_always_off (OpenTelemetry's names).
    traces_sampler: str = Field(
        default="parentbased_always_on",
        validation_alias=AliasChoices("FERRY_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER"),
    )
    #: Ratio of the *traceidratio samplers (0..1), e.g. 0.1 for 10 %.
    traces_sampler_arg: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        validation_alias=AliasChoices("FERRY_TRACES_SAMPLER_ARG", "OTEL_TRACES_SAMPLER_ARG"),
    )
    #: OTEL_SDK_DISABLED=true turns tracing off whatever the exporter says.
    otel_sdk_disabled: bool = Field(
        default=False, validation_alias=AliasChoices("OTEL_SDK_DISABLED")
    )
    #: Shortest interval (s) between the database and JetStream queries behind the
    #: /metrics gauges (backlogs, lag); a scrape inside it gets the previous values.
    metrics_refresh_interval: float = Field(
        default=5.0, ge=0.0, validation_alias=AliasChoices("FERRY_METRICS_REFRESH_INTERVAL")
    )
    #: The event loop: ``auto`` (uvloop where it is installed, else asyncio's), ``uvloop``
    #: or ``asyncio`` (:mod:`shared.runtime.loop`; uvloop costs each role less CPU).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    #: Young-generation threshold of Python's garbage collector (net allocations of
    #: container objects between passes) in every Ferry process; start-up objects are
    #: frozen out of collection (:mod:`shared.runtime.loop`). Python's own is 700.
    gc_threshold: int = Field(
        default=10_000, ge=100, le=1_000_000, validation_alias=AliasChoices("FERRY_GC_THRESHOLD")
    )
    #: Link to a trace in the tracing UI, ``{trace_id}`` replaced by the trace's id, e.g.
    #: ``http://jaeger:16686/trace/{trace_id}``: ``ferry where`` prints it, the console's
    #: journey links to it (``FERRY_TRACE_URL_TEMPLATE`` is its older name).
    trace_url_template: str | None = Field(
        default=None, validation_alias=AliasChoices("FERRY_TRACE_URL", "FERRY_TRACE_URL_TEMPLATE")
    )

    def load_topology(self) -> Topology:
        """The topology named by ``FERRY_TOPOLOGY``, its events from ``FERRY_REGISTRY``."""
        return load_topology(self.topology, registry=self.registry)

    def dsn(self, database: str) -> str:
        """DSN of ``database``: the explicit one if set, else the template."""
        if database in self.databases:
            return self.databases[database]
        if "{database}" not in self.dsn_template:
            raise ConfigurationError(
                f"FERRY_DSN_TEMPLATE {self.dsn_template!r} lacks '{{database}}' and "
                f"FERRY_DATABASES has no entry for {database!r}"
            )
        return self.dsn_template.replace("{database}", database)

    def nats_servers(self) -> list[str]:
        """``nats_url`` split into a list."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    def nats_auth(self) -> NatsAuth:
        """This process's NATS credentials and TLS files (the password read from its file)."""
        secret = read_secret(self.nats_password, self.nats_password_file, "FERRY_NATS_PASSWORD")
        if secret is not None and self.nats_user is None:
            raise ConfigurationError("FERRY_NATS_PASSWORD(_FILE) is set but FERRY_NATS_USER is not")
        return NatsAuth(
            user=self.nats_user,
            password=None if secret is None else secret.decode(),
            creds_file=self.nats_creds_file,
            nkey_seed_file=self.nats_nkey_seed_file,
            tls_ca=self.nats_tls_ca,
            tls_cert=self.nats_tls_cert,
            tls_key=self.nats_tls_key,
            tls_handshake_first=self.nats_tls_handshake_first,
        )


class PublisherSettings(CommonSettings):
    """outbox-publisher: one process (or several replicas) per context."""

    #: The context whose outbox this process publishes.
    context: str = "sea"
    #: Rows claimed per batch.
    batch_size: int = Field(default=500, ge=1, le=10_000)
    #: Batches in flight at once (each holds one database connection).
    concurrency: int = Field(default=3, ge=1, le=64)
    #: Polling fallback when no NOTIFY arrives, in seconds.
    poll_interval: float = Field(default=policy.POLL_INTERVAL, gt=0)
    #: Seconds a woken worker waits before it claims, so that the commits right behind
    #: the one that woke it join its batch — only while another worker is publishing and
    #: commits have lately come less than ``linger`` apart; otherwise it claims at once
    #: (0: never wait).
    linger: float = Field(default=0.005, ge=0, le=1.0)
    #: Seconds a worker woken by a NOTIFY waits before it claims, even with no other
    #: worker publishing, so that at a moderate rate the commits right behind it fill one
    #: batch — only while commits have lately come less than this apart (an isolated
    #: commit is claimed at once, and none waits longer than this); it claims early once
    #: enough commits were notified to fill ``batch_size``. 0: only ``linger`` applies.
    publisher_linger: float = Field(default=0.01, ge=0, le=1.0)
    #: While commits come quicker than ``publisher_linger`` (or ``linger``, at least 5 ms)
    #: apart, claim on that period by itself and say so in table ``outbox_watch``, so that
    #: producers' commits skip their NOTIFY (each one serialises the cluster's commits);
    #: a quiet outbox is still woken by the NOTIFY of its first commit. false: every
    #: commit notifies (the earlier behaviour).
    publisher_watch: bool = True
    #: Seconds to wait for a PubAck before the row is retried.
    publish_timeout: float = Field(default=policy.PUBLISH_TIMEOUT, gt=0)
    #: Seconds SIGTERM allows for in-flight batches (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
    #: First and longest back-off after a failed batch, in seconds.
    retry_initial: float = Field(default=0.2, gt=0)
    retry_max: float = Field(default=policy.RETRY_MAX, gt=0)
    #: Attempts after which a row the stream keeps refusing is set aside (the attempts of
    #: an outage — no PubAck, no responders, no connection — never set a row aside; a
    #: payload that cannot be built or a message over the size limits is set aside at once).
    max_publish_attempts: int = Field(default=20, ge=1, le=1_000_000)
    #: Publish each claimed batch as JetStream atomic batches (nats-server 2.12+, the
    #: stream's ``allow_atomic``, which ``ferry provision`` sets): one stored write per
    #: batch instead of one fsync per event. Any refusal (an event id already in the
    #: duplicate window, a stream without ``allow_atomic``) falls back to publishing the
    #: rows one by one; false: always one by one.
    atomic_batches: bool = True
    #: Claims of fewer rows go one by one even with ``atomic_batches``: an atomic batch
    #: costs nats-server about 2 ms of CPU of its own, more than it saves below about 30
    #: messages (so at a moderate rate, whose claims are small, nothing changes).
    atomic_min_rows: int = Field(default=32, ge=1, le=10_000)


class ConsumerSettings(CommonSettings):
    """inbox-consumer: one process (or several replicas) per durable."""

    #: The durable this process consumes (a key of the topology's ``durables``).
    durable: str = "sea__from_vibespro"
    #: Overrides the topology's handler URL (ports differ per deployment).
    handler_url: str | None = None
    #: CA that verifies the handler's HTTPS certificate (host name included); unset: the
    #: system's CAs. Reloaded when the file changes (issue 47).
    handler_tls_ca: Path | None = None
    #: Client certificate and key shown to the handler (mutual TLS, on top of the signature);
    #: reloaded when the files change.
    handler_tls_cert: Path | None = None
    handler_tls_key: Path | None = None
    #: Handler calls in flight at once (also bounded by the durable's max_ack_pending).
    concurrency: int = Field(default=64, ge=1, le=1000)
    #: How long the consumer waits for a first message before looping, in seconds (a
    #: batch is handed over as soon as anything arrived; this only paces idle loops).
    fetch_timeout: float = Field(default=1.0, gt=0)
    #: Batches processed at once: the next is claimed while the handler works on one.
    #: All of them count against the durable's max_ack_pending; room left beyond them
    #: lets the next batches arrive while these are processed (a batch-call drain kept
    #: 1.4 of 2 cores busy with no room, about 1.55 with as much again).
    pipeline: int = Field(default=4, ge=1, le=16)
    #: Seconds to wait, after a first message, for the ones right behind it before a
    #: batch is handed over — only while another batch is in process and messages have
    #: lately come less than ``linger`` apart; otherwise it is handed over at once (0:
    #: never wait).
    linger: float = Field(default=0.005, ge=0, le=1.0)
    #: Extra seconds an inbox lease outlives the handler timeout.
    lease_margin: float = Field(default=30.0, ge=0)
    #: Longest delay a handler's Retry-After can ask for, in seconds: the nak delay is
    #: max(ladder step, min(Retry-After, this)).
    retry_after_cap: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    #: Seconds SIGTERM allows for in-flight messages (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
    #: This durable's secret for signing handler calls (HMAC-SHA256); unset: unsigned.
    handler_secret: SecretStr | None = None
    #: File holding the secret instead (a mounted Kubernetes Secret); wins when both set.
    handler_secret_file: Path | None = None
    #: First and longest pause (s) while the handler refuses our credentials (401/403):
    #: the message is held (not nak'ed, never dead-lettered) and the call retried.
    auth_retry_initial: float = Field(default=1.0, gt=0)
    auth_retry_max: float = Field(default=30.0, gt=0)
    #: Largest message body parsed; a larger one is dead-lettered as MESSAGE_TOO_LARGE.
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024)
    #: ``ordering: key`` durables: seconds a replica's lease on a partition lasts without
    #: renewal; a dead replica's partitions are taken over after at most this. A replica
    #: works on a partition only while its lease outlasts the durable's ``ack_wait`` plus
    #: its pull requests' lifetime (1 s) and a second (so that what it fetched is
    #: redeliverable when the lease expires), so the ttl must exceed that sum (the role
    #: refuses to start otherwise). Unset: that sum plus 5 s (12 s for an ``ack_wait`` of
    #: 5 s). Renewed every third of the ttl, or every half of the time left to work, if
    #: shorter.
    partition_lease_ttl: float | None = Field(default=None, gt=0)

    def lease_ttl(self, ack_wait: float) -> float:
        """The partition lease ttl for a durable of ``ack_wait`` (see the setting)."""
        if self.partition_lease_ttl is not None:
            return self.partition_lease_ttl
        return ack_wait + ORDERED_PULL_LIFETIME + DEFAULT_LEASE_SLACK

    #: Seconds between reads of the durable's throttle override (``ferry durable
    #: throttle``): a changed rate limit is in force within about this long, no restart.
    throttle_poll_interval: float = Field(default=2.0, gt=0, le=60)

    def signing_secret(self) -> bytes | None:
        """The handler-signing secret, from the file or the variable."""
        return read_secret(self.handler_secret, self.handler_secret_file, "FERRY_HANDLER_SECRET")


class RouterSettings(CommonSettings):
    """dlq-router: one process (or more replicas) per topology."""

    #: How long one fetch of advisories waits before looping, in seconds.
    fetch_timeout: float = Field(default=1.0, gt=0)
    #: Seconds SIGTERM allows for the advisories in hand (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
    #: Seconds between sweeps for exhaustions no advisory reported (0: no sweep).
    sweep_interval: float = Field(default=15.0, ge=0)
    #: Seconds added to a durable's redelivery horizon before the sweep takes a row.
    sweep_margin: float = Field(default=300.0, ge=0)
    #: Seconds a row whose last delivery (``max_deliver``) failed waits for its advisory
    #: before the sweep dead-letters it (JetStream delivers it no more; a late advisory
    #: adds nothing to the sweep's record).
    sweep_spent_after: float = Field(default=30.0, ge=0)


class ReplayerSettings(CommonSettings):
    """dlq-replayer: one process per topology (replicas are safe: rows are locked)."""

    #: Seconds between scans for due dead letters.
    interval: float = Field(default=1.0, gt=0)
    #: Due dead letters taken per durable per scan.
    batch_size: int = Field(default=100, ge=1, le=10_000)
    #: Seconds after which a replay whose publish was not confirmed is published again.
    unconfirmed_after: float = Field(default=30.0, gt=0)
    #: Seconds SIGTERM allows for the replays in hand (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
