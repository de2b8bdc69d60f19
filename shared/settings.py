"""Runtime settings, read from the environment (prefix ``FERRY_``) and nothing else.

One class per role, each built from :class:`CommonSettings`. This module is the only
place in Ferry that reads ``os.environ`` (through pydantic-settings). Every field is
documented in README.md's settings table.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.domain.durations import parse_size
from shared.domain.errors import ConfigurationError
from shared.provision import Caps
from shared.topology import Topology, load_topology

#: Default DSN template: ``{database}`` is replaced by the context's database name.
DEFAULT_DSN_TEMPLATE = "postgresql://postgres@127.0.0.1:5432/{database}"


class CommonSettings(BaseSettings):
    """Settings every role shares."""

    model_config = SettingsConfigDict(env_prefix="FERRY_", extra="ignore")

    #: Path of the topology file (see topologies/).
    topology: Path = Path("topologies/sea-vibespro.yaml")
    #: NATS server URLs, comma-separated.
    nats_url: str = "nats://127.0.0.1:4222"
    #: Per-database DSNs as JSON, e.g. ``{"sea": "postgresql://..."}``; wins over the template.
    databases: dict[str, str] = Field(default_factory=dict)
    #: DSN for any database not listed in ``databases``.
    dsn_template: str = DEFAULT_DSN_TEMPLATE
    #: Caps every stream's replicas (1 for a single dev server; unset in production).
    max_stream_replicas: int | None = None
    #: Caps every stream's max_bytes, e.g. "1GB" (JetStream reserves it; unset in production).
    max_stream_bytes: str | None = None

    def stream_caps(self) -> Caps:
        """The caps provisioning applies over the topology."""
        size = None if self.max_stream_bytes is None else parse_size(self.max_stream_bytes)
        return Caps(max_replicas=self.max_stream_replicas, max_bytes=size)

    #: Port of /healthz, /readyz (0 or unset: no HTTP health endpoint).
    health_port: int | None = None
    #: Interface the health endpoint binds.
    health_host: str = "127.0.0.1"
    #: Log level name.
    log_level: str = "INFO"
    #: Seconds between client PINGs; a dead link is noticed after ~3 missed ones.
    nats_ping_interval: float = 2.0

    def load_topology(self) -> Topology:
        """The topology named by ``FERRY_TOPOLOGY``."""
        return load_topology(self.topology)

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


class PublisherSettings(CommonSettings):
    """outbox-publisher: one process (or several replicas) per context."""

    #: The context whose outbox this process publishes.
    context: str = "sea"
    #: Rows claimed per batch.
    batch_size: int = Field(default=500, ge=1, le=10_000)
    #: Batches in flight at once (each holds one database connection).
    concurrency: int = Field(default=3, ge=1, le=64)
    #: Polling fallback when no NOTIFY arrives, in seconds.
    poll_interval: float = Field(default=1.0, gt=0)
    #: Seconds to wait for a PubAck before the row is retried.
    publish_timeout: float = Field(default=5.0, gt=0)
    #: Seconds SIGTERM allows for in-flight batches (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
    #: First and longest back-off after a failed batch, in seconds.
    retry_initial: float = Field(default=0.2, gt=0)
    retry_max: float = Field(default=5.0, gt=0)


class ConsumerSettings(CommonSettings):
    """inbox-consumer: one process (or several replicas) per durable."""

    #: The durable this process consumes (a key of the topology's ``durables``).
    durable: str = "sea__from_vibespro"
    #: Overrides the topology's handler URL (ports differ per deployment).
    handler_url: str | None = None
    #: Handler calls in flight at once (also bounded by the durable's max_ack_pending).
    concurrency: int = Field(default=64, ge=1, le=1000)
    #: How long one fetch waits for messages before looping, in seconds.
    fetch_timeout: float = Field(default=1.0, gt=0)
    #: Extra seconds an inbox lease outlives the handler timeout.
    lease_margin: float = Field(default=30.0, ge=0)
    #: Longest Retry-After honoured, in seconds.
    retry_after_cap: float = Field(default=600.0, gt=0)
    #: Seconds SIGTERM allows for in-flight messages (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)


class RouterSettings(CommonSettings):
    """dlq-router: one process (or more replicas) per topology."""

    #: How long one fetch of advisories waits before looping, in seconds.
    fetch_timeout: float = Field(default=1.0, gt=0)
    #: Seconds SIGTERM allows for the advisories in hand (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)


class ReplayerSettings(CommonSettings):
    """dlq-replayer: one process per topology (replicas are safe: rows are locked)."""

    #: Seconds between scans for due dead letters.
    interval: float = Field(default=1.0, gt=0)
    #: Due dead letters taken per durable per scan.
    batch_size: int = Field(default=100, ge=1, le=10_000)
    #: Seconds SIGTERM allows for the replays in hand (< supervisord stopwaitsecs).
    drain_deadline: float = Field(default=8.0, gt=0)
