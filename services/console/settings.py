"""Settings of the operator console (``FERRY_CONSOLE_*``), documented in
docs/reference/settings.md from the ``#:`` comments below."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field

from shared.runtime.settings import CommonSettings


class ConsoleSettings(CommonSettings):
    """console: one process per topology (``python -m services.console``)."""

    #: Address the console listens on (``0.0.0.0`` in a container).
    console_host: str = "127.0.0.1"
    #: Port of the console's pages; it also serves /healthz, /readyz and /metrics there.
    console_port: int = Field(default=8090, ge=0, le=65535)
    #: JSON file of operator accounts: ``{"NAME": {"role": "operator"|"read-only",
    #: "password": "scrypt$…"}}``; hashes from ``python -m services.console hash-password``.
    console_accounts_file: Path | None = None
    #: File holding a bearer token (``Authorization: Bearer …``) set by the deployment.
    console_token_file: Path | None = None
    #: Role of a request signed in with the bearer token.
    console_token_role: Literal["read-only", "operator"] = "read-only"
    #: File holding the key that signs session cookies (random per process when unset:
    #: sessions then end when the console restarts, and replicas do not share them).
    console_session_key_file: Path | None = None
    #: Seconds a sign-in lasts.
    console_session_ttl: float = Field(default=8 * 3600.0, gt=0)
    #: Name of the session cookie (default ``ferry_console_{topology}_{port}``: cookies are
    #: not per port, so every console on one host needs its own name).
    console_cookie_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]+$")
    #: Send the session cookie only over HTTPS (set it behind a TLS-terminating ingress;
    #: always on when the console serves HTTPS itself).
    console_secure_cookie: bool = False
    #: Serve HTTPS with this certificate and key (issue 47), reloaded when the files change:
    #: new connections get the new certificate, no restart.
    console_tls_cert: Path | None = None
    console_tls_key: Path | None = None

    @property
    def secure_cookie(self) -> bool:
        """Session cookies only over HTTPS: asked for, or the console serves HTTPS."""
        return self.console_secure_cookie or self.console_tls_cert is not None

    #: Seconds between the overview's samples (the sparklines keep the last hour).
    console_sample_interval: float = Field(default=15.0, gt=0)
    #: Replays per second of a bulk replay when the form does not say (at most 100).
    console_replay_rate: float = Field(default=10.0, gt=0, le=100)
    #: Directory of the KPI job's reports (``FERRY_KPI_REPORT_DIR``): the KPI page.
    console_kpi_dir: Path | None = Field(
        default=None, validation_alias=AliasChoices("FERRY_CONSOLE_KPI_DIR", "FERRY_KPI_REPORT_DIR")
    )
    #: Link of the Event page's trace step to the tracing UI, ``{trace_id}`` replaced by
    #: the id of the event's trace (from its traceparent), e.g.
    #: ``http://jaeger:16686/trace/{trace_id}``; ``ferry where`` prints the same link.
    trace_url_template: str | None = Field(
        default=None, validation_alias=AliasChoices("FERRY_TRACE_URL", "FERRY_TRACE_URL_TEMPLATE")
    )
    #: Base URL of Jaeger's UI (``http://localhost:16686``): the Event page links a trace
    #: to ``{url}/trace/{trace_id}`` (``FERRY_TRACE_URL`` wins when set).
    console_jaeger_url: str | None = None
    #: Glob of exported span files (JSON lines, ``FERRY_TRACES_EXPORTER=file``) the Event
    #: page draws a trace's timeline from, e.g. ``.var/traces/*.jsonl``.
    console_spans_glob: str | None = None
    #: The roles' liveness endpoints the overview probes, a JSON object of role name to its
    #: ``/healthz`` URL, e.g. ``{"inbox-consumer-sea__from_vibespro":
    #: "http://127.0.0.1:9101/healthz"}``. An ``inbox-consumer-DURABLE`` role that does not
    #: answer marks its durable's row as down at once, before its lag alert fires. Empty
    #: (the default): no liveness shown. supervisord.conf and the Kubernetes manifests
    #: (a Service per role) set it to every role of the topology.
    console_role_health: dict[str, str] = Field(default_factory=dict)
    #: Seconds a role's ``/healthz`` has to answer before the overview shows it down.
    console_role_health_timeout: float = Field(default=1.0, gt=0, le=10)
    #: Seconds SIGTERM allows for requests and replays in hand.
    drain_deadline: float = Field(default=8.0, gt=0)
