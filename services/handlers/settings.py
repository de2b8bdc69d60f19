"""Settings of the handler role (environment prefix ``FERRY_``, like every role)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, SecretStr

from shared.domain.errors import ConfigurationError
from shared.domain.signing import DEFAULT_TOLERANCE
from shared.runtime.settings import CommonSettings

#: FERRY_ENVIRONMENT values that mean production.
PRODUCTION_NAMES = frozenset({"production", "prod"})


class HandlerSettings(CommonSettings):
    """handler-<service>: one example handler service, serving its context's durables."""

    #: The service to run; also the context whose database it uses (``sea``, ``module_f``...).
    service: str | None = None
    #: Port to listen on. Unset: every port named by the handler URLs of the durables
    #: that target this context (module_g serves two durables, so two ports).
    port: int | None = Field(default=None, ge=0, le=65535)
    #: Interface to bind.
    host: str = "127.0.0.1"
    #: Serve HTTPS with this certificate and key (issue 47): the consumers then call an
    #: ``https://`` URL. Reloaded when the files change: new connections get the new one.
    handler_tls_cert: Path | None = None
    handler_tls_key: Path | None = None
    #: Require a client certificate from this CA (mutual TLS, on top of the signature).
    handler_tls_client_ca: Path | None = None
    #: Secrets of the durables allowed to call, as JSON ``{"durable": "secret"}``. Set (or
    #: the file), every request must be signed by one of them (401 otherwise).
    handler_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    #: A JSON file with the same map (a mounted Kubernetes Secret); wins when both set.
    handler_secrets_file: Path | None = None
    #: Seconds a signature stays valid either side of our clock (older: replayed, 401).
    signature_tolerance: float = Field(default=DEFAULT_TOLERANCE, gt=0)
    #: Obey the ``_ferry_test`` fault directives of payloads (force a status or a poison,
    #: sleep at most a minute): for the dev stack, the demo, the tests and chaos runs only.
    #: Off (the default), ``_ferry_test`` is ordinary payload data that changes nothing.
    #: The service refuses to start with it on when FERRY_ENVIRONMENT is ``production``.
    handler_fault_injection: bool = False
    #: Execute the replay API's jobs (the handler of the context whose durable handles
    #: ``replay_job_requested``: module_g, durable cg_replay): connect to NATS as
    #: FERRY_NATS_USER (``handler-module_g``) and replay dead letters in every database of
    #: the topology through ``ferry dlq replay``'s audited path. Off, a replay job is
    #: answered 503 and retried until a handler with it on takes it.
    handler_replay_jobs: bool = False
    #: Replays per second within one replay job (0: no pause between two replays).
    handler_replay_rate: float = Field(default=20.0, ge=0, le=1000)
    #: Seconds SIGTERM allows calls in flight to finish (and the pool to close), below
    #: supervisord's stopwaitsecs; past it the process exits 4.
    drain_deadline: float = Field(default=8.0, gt=0)
    #: The kind of deployment: ``production`` (k8s/overlays/prod sets it) forbids
    #: FERRY_HANDLER_FAULT_INJECTION; anything else (``development``, ``test``...) allows it.
    environment: str = "development"

    def is_production(self) -> bool:
        """Whether FERRY_ENVIRONMENT names production (``production`` or ``prod``, any case)."""
        return self.environment.strip().lower() in PRODUCTION_NAMES

    def check_fault_injection(self) -> None:
        """Refuse fault injection in production (:class:`ConfigurationError`)."""
        if self.handler_fault_injection and self.is_production():
            raise ConfigurationError(
                "FERRY_HANDLER_FAULT_INJECTION=true is refused when FERRY_ENVIRONMENT is "
                f"{self.environment!r}: any producer could force this handler's answers "
                "with a _ferry_test payload field; unset it (it is off by default)"
            )

    def verification_secrets(self) -> dict[str, bytes]:
        """Durable → secret; empty when calls are not verified. Errors never show a secret."""
        if self.handler_secrets_file is not None:
            path = self.handler_secrets_file
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigurationError(
                    f"FERRY_HANDLER_SECRETS_FILE {path}: cannot read: {exc.strerror}"
                ) from exc
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"FERRY_HANDLER_SECRETS_FILE {path}: not JSON (line {exc.lineno})"
                ) from None
            if not isinstance(doc, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in doc.items()
            ):
                raise ConfigurationError(
                    f"FERRY_HANDLER_SECRETS_FILE {path}: must map durable names to non-empty "
                    "secrets"
                )
            return {k: v.encode() for k, v in doc.items()}
        return {k: v.get_secret_value().encode() for k, v in self.handler_secrets.items()}
