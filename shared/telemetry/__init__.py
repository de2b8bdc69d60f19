"""Telemetry: the OpenTelemetry SDK set-up, span helpers and the log context (:mod:`.otel`).

Imports only :mod:`shared.contracts` and :mod:`shared.domain` below it; the adapters and
every role above use it to trace and to log with trace ids.
"""
