"""Ferry's common package, in layers; a layer imports only the layers below it.

    ops        the ``ferry`` command and its subcommands
    runtime    settings, logs, health, metrics, the one role lifecycle
    access     identities, NATS and PostgreSQL permissions, stream provisioning
    adapters   the only code that touches PostgreSQL, NATS and HTTP; the producer API
    telemetry  OpenTelemetry set-up, spans, log context
    contracts  topology, manifests, the handler registry (a data file), lint, AsyncAPI
    domain     pure: envelope, subjects, ACK rules, policy, ports (standard library only)

``lint-imports`` (``[tool.importlinter]`` in pyproject.toml) keeps the order. Every role
(``services/*``) imports from here; roles never import each other.
"""
