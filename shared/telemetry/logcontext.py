"""The log context: fields every log line of a task carries, plus its trace ids
(:func:`log_context`, read by ``shared.runtime.logs``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace

from shared.telemetry.propagation import parse_traceparent

#: Fields every log line of the current task carries (durable, message_id, traceparent).
_LOG_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ferry_log_fields", default=None
)


@contextlib.contextmanager
def log_fields(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line written inside the block (this task only)."""
    merged = {**(_LOG_FIELDS.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _LOG_FIELDS.set(merged)
    try:
        yield
    finally:
        _LOG_FIELDS.reset(token)


def set_log_fields(**fields: Any) -> None:
    """Add ``fields`` to the log lines of this task and of the tasks it starts later."""
    _LOG_FIELDS.set({**(_LOG_FIELDS.get() or {}), **fields})


def log_context() -> dict[str, Any]:
    """Fields for a log line: the task's fields plus trace_id/span_id.

    The ids come from the current span when tracing is on; when it is off, from the
    traceparent the message carried (so a line can still be found by the producer's
    trace id).
    """
    fields = dict(_LOG_FIELDS.get() or {})
    traceparent = fields.pop("traceparent", None)
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        fields["trace_id"] = trace.format_trace_id(ctx.trace_id)
        fields["span_id"] = trace.format_span_id(ctx.span_id)
    else:
        ids = parse_traceparent(traceparent)
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
    return fields
