"""Ferry's tracer provider: which provider records Ferry's spans, and whether any does.

Tracing is off unless an exporter is configured (``FERRY_TRACES_EXPORTER`` or
``OTEL_TRACES_EXPORTER``): then :func:`active` is false and every helper of
:mod:`shared.telemetry` returns before creating anything, so the hot paths pay one boolean
test. Ferry keeps its own tracer (:func:`use_tracer_provider`) instead of relying only on
the process-global one, so tests can run several in-process roles against an in-memory
exporter; role processes also install it globally for third-party instrumentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased

#: Instrumentation scope of Ferry's own spans.
TRACER_NAME = "ferry"


@dataclass
class _State:
    tracer: trace.Tracer | None = None
    provider: TracerProvider | None = None
    instrumented: list[Any] = field(default_factory=list)
    #: The sampler follows the parent's decision: a child of an unsampled span can skip
    #: the SDK altogether (most hops at a 10 % ratio).
    parent_based: bool = False


_state = _State()


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make ``provider`` Ferry's tracer provider (None: tracing off again)."""
    _state.provider = provider
    _state.tracer = None if provider is None else provider.get_tracer(TRACER_NAME)
    _state.parent_based = provider is not None and isinstance(provider.sampler, ParentBased)


def active() -> bool:
    """Whether spans are being recorded at all (false: every helper is a no-op)."""
    return _state.tracer is not None


def tracer() -> trace.Tracer:
    """Ferry's tracer; the process-global one when Ferry configured none (a producer
    application that set up OpenTelemetry itself still gets ``create`` spans)."""
    return _state.tracer or trace.get_tracer(TRACER_NAME)
