"""Tracing set up from settings: tracer provider, exporters, sampler, instrumentation,
shutdown (see docs/reference/metrics.md, "Spans")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from shared.domain.errors import ConfigurationError
from shared.telemetry import otlp_wire
from shared.telemetry.propagation import inject
from shared.telemetry.provider import TRACER_NAME, _state, use_tracer_provider

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.util.types import Attributes

log = logging.getLogger("ferry.telemetry")


class TracingSettings(Protocol):
    """The settings tracing is set up from (``shared.runtime.settings.CommonSettings``).

    A protocol, so this layer does not import the runtime layer above it.
    """

    @property
    def otel_sdk_disabled(self) -> bool: ...
    @property
    def traces_exporter(self) -> str: ...
    @property
    def otlp_protocol(self) -> str: ...
    @property
    def otlp_endpoint(self) -> str | None: ...
    @property
    def otlp_fast_encoding(self) -> bool: ...
    @property
    def traces_file(self) -> Path: ...
    @property
    def traces_sampler(self) -> str: ...
    @property
    def traces_sampler_arg(self) -> float: ...


#: Exporter names accepted by FERRY_TRACES_EXPORTER / OTEL_TRACES_EXPORTER.
EXPORTERS = frozenset({"none", "otlp", "file", "console"})
PROTOCOLS = frozenset({"grpc", "http/protobuf"})


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to a file as one JSON object per line (local use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans``; a file error fails the batch (the processor logs it)."""
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        try:
            with self._lock, self.path.open("a", encoding="utf-8") as out:
                out.write(lines)
        except OSError as exc:
            log.warning("cannot write spans to %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing held open between exports."""


class _NoOrphanQueries(Sampler):
    """Drops a *root* span of a database query, else asks ``root``.

    The publisher's claims and the replayer's scans run outside any message's trace:
    sampled as roots they would bury the message traces under one-span traces.
    Queries inside a message's span are sampled with it (ParentBased).
    """

    def __init__(self, root: Sampler) -> None:
        self.root = root

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if attributes and ("db.system" in attributes or "db.system.name" in attributes):
            return SamplingResult(Decision.DROP)
        return self.root.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"NoOrphanQueries{{{self.root.get_description()}}}"


def build_sampler(name: str, ratio: float) -> Sampler:
    """The sampler OpenTelemetry calls ``name`` (OTEL_TRACES_SAMPLER's values)."""
    roots: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
    }
    key = name.strip().lower()
    if key in roots:
        return _NoOrphanQueries(roots[key])
    if key.startswith("parentbased_") and key.removeprefix("parentbased_") in roots:
        return ParentBased(_NoOrphanQueries(roots[key.removeprefix("parentbased_")]))
    choices = sorted([*roots, *(f"parentbased_{r}" for r in roots)])
    raise ConfigurationError(
        f"FERRY_TRACES_SAMPLER / OTEL_TRACES_SAMPLER {name!r} is not one of {', '.join(choices)}"
    )


def exporter_names(settings: TracingSettings) -> list[str]:
    """The configured exporters; empty means tracing is off."""
    if settings.otel_sdk_disabled:
        return []
    names = [n.strip().lower() for n in settings.traces_exporter.split(",") if n.strip()]
    unknown = sorted(set(names) - EXPORTERS)
    if unknown:
        raise ConfigurationError(
            f"FERRY_TRACES_EXPORTER / OTEL_TRACES_EXPORTER: unknown exporter(s) "
            f"{', '.join(unknown)}; use {', '.join(sorted(EXPORTERS))}"
        )
    return [n for n in names if n != "none"]


def _otlp_exporter(settings: TracingSettings) -> SpanExporter:
    protocol = settings.otlp_protocol.strip().lower()
    if protocol not in PROTOCOLS:
        raise ConfigurationError(
            f"FERRY_OTLP_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL {settings.otlp_protocol!r}: "
            f"use {' or '.join(sorted(PROTOCOLS))}"
        )
    endpoint = settings.otlp_endpoint
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    exporter = HttpExporter(endpoint=endpoint)
    if settings.otlp_fast_encoding:
        if otlp_wire.install():
            log.info("OTLP/HTTP spans encoded by Ferry's encoder (FERRY_OTLP_FAST_ENCODING)")
    else:
        otlp_wire.uninstall()
    return exporter


def _exporter(name: str, settings: TracingSettings) -> SpanExporter:
    if name == "otlp":
        return _otlp_exporter(settings)
    if name == "file":
        return JsonLinesSpanExporter(settings.traces_file)
    return ConsoleSpanExporter()


@dataclass
class Tracing:
    """What :func:`setup_tracing` installed; :meth:`shutdown` flushes and removes it."""

    provider: TracerProvider | None

    def shutdown(self) -> None:
        """Flush the spans in hand, uninstrument, and turn Ferry's tracing off."""
        uninstrument()
        if self.provider is not None:
            self.provider.shutdown()
        use_tracer_provider(None)


def setup_tracing(role: str, settings: TracingSettings, *, install_global: bool = True) -> Tracing:
    """Tracing of one role process from its settings (see docs/reference/metrics.md, "Spans").

    ``service.name`` is the role; OTEL_RESOURCE_ATTRIBUTES adds to the resource (the SDK
    reads it). With no exporter configured nothing is installed and tracing costs nothing.
    """
    names = exporter_names(settings)
    if not names:
        return Tracing(None)
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: role}),
        sampler=build_sampler(settings.traces_sampler, settings.traces_sampler_arg),
    )
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, settings)))
    use_tracer_provider(provider)
    if install_global:
        trace.set_tracer_provider(provider)
    instrument(provider)
    log.info(
        "tracing on: exporters %s, sampler %s",
        ", ".join(names),
        provider.sampler.get_description(),
    )
    return Tracing(provider)


def instrument(provider: TracerProvider) -> None:
    """Trace asyncpg queries and aiohttp client calls into ``provider`` — inside recording
    spans only.

    The instrumentations wrap every query and request and would start a span for each,
    sampled or not: measured, that halved the consumer's throughput at 10 % sampling. So
    the calling context (a role's main task, which every later task copies) suppresses
    them, and :func:`current` lifts the suppression inside a recording span only: SQL and
    HTTP calls of sampled messages are traced, the rest pay one context lookup.

    aiohttp client calls get Ferry's own wrapper (:class:`_AioHttpClientSpans`), not
    OpenTelemetry's aiohttp instrumentation: that one adds a ``TraceConfig`` to every
    session, and aiohttp then builds and sends its request signals for *every* request,
    sampled or not (measured: 6 % of the consumer's samples at 10 % sampling).
    """
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    asyncpg_instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    instrumentors: tuple[Any, ...] = (asyncpg_instrumentor, _AioHttpClientSpans())
    for instrumentor in instrumentors:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            _state.instrumented.append(instrumentor)
    otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))


#: The URL attributes of a client span, by URL: a consumer calls one or two handlers.
_URLS: dict[str, dict[str, Any]] = {}


def _url_attributes(url: Any) -> dict[str, Any]:
    """``url.full`` without credentials or query, ``server.address``, ``server.port``."""
    text = str(url)
    found = _URLS.get(text)
    if found is None:
        import yarl

        target = yarl.URL(text)
        found = {
            "url.full": str(target.with_user(None).with_query(None)),
            "server.address": target.host or "",
            "server.port": target.port or 0,
        }
        if len(_URLS) >= 256:
            _URLS.clear()
        _URLS[text] = found
    return found


class _AioHttpClientSpans:
    """A CLIENT span per aiohttp request made inside a *recording* span, its context in
    the request's ``traceparent``; any other request goes straight through.

    Wraps ``aiohttp.ClientSession._request`` (what ``get``, ``post``, ``request`` call),
    so every session is covered, made before or after. The span ends when the response's
    status line and headers are in (as OpenTelemetry's aiohttp instrumentation does).
    """

    _original: Any = None

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return _AioHttpClientSpans._original is not None

    def instrument(self, *, tracer_provider: TracerProvider) -> None:
        import aiohttp

        if _AioHttpClientSpans._original is not None:
            return
        original = aiohttp.ClientSession._request
        tracer = tracer_provider.get_tracer(TRACER_NAME)

        def _request(
            session: aiohttp.ClientSession, method: str, url: Any, *args: Any, **kwargs: Any
        ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
            # A plain function handing back aiohttp's own coroutine when nothing is traced:
            # a coroutine of ours around it would be resumed at every step of every request
            # (measured: 2.5 % of the consumer's CPU at 10 % sampling).
            if not trace.get_current_span().is_recording() or otel_context.get_value(
                _SUPPRESS_INSTRUMENTATION_KEY
            ):
                return original(session, method, url, *args, **kwargs)
            return _traced(session, method, url, *args, **kwargs)

        async def _traced(
            session: aiohttp.ClientSession, method: str, url: Any, *args: Any, **kwargs: Any
        ) -> aiohttp.ClientResponse:
            span = tracer.start_span(
                method.upper(),
                kind=SpanKind.CLIENT,
                attributes={"http.request.method": method.upper(), **_url_attributes(url)},
            )
            headers = dict(kwargs.get("headers") or {})
            inject(headers, span)
            kwargs["headers"] = headers
            try:
                response = await original(session, method, url, *args, **kwargs)
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
                span.set_attribute("error.type", type(exc).__name__)
                span.end()
                raise
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 400:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", str(response.status))
            span.end()
            return response

        _AioHttpClientSpans._original = original
        aiohttp.ClientSession._request = _request  # type: ignore[method-assign,assignment]

    def uninstrument(self) -> None:
        import aiohttp

        if _AioHttpClientSpans._original is not None:
            aiohttp.ClientSession._request = _AioHttpClientSpans._original  # type: ignore[method-assign]
            _AioHttpClientSpans._original = None


def uninstrument() -> None:
    """Undo :func:`instrument` (tests install and remove providers repeatedly)."""
    while _state.instrumented:
        _state.instrumented.pop().uninstrument()
