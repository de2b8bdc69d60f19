"""The log context: fields every log line of a task carries, plus its trace ids
(:func:`log_context`, read by ``shared.runtime.logs``)."""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import trace

from shared.telemetry.propagation import parse_traceparent

#: Fields every log line of the current task carries (durable, message_id, traceparent).
_LOG_FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ferry_log_fields", default=None
)


class log_fields:  # a lower-case name: used as a function, ``with log_fields(...):``
    """Add ``fields`` to every log line written inside the block (this task only).

    A class rather than a generator: a consumer enters it twice per message."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: contextvars.Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        fields = {k: v for k, v in self._fields.items() if v is not None}
        self._token = _LOG_FIELDS.set({**(_LOG_FIELDS.get() or {}), **fields})

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _LOG_FIELDS.reset(self._token)
            self._token = None


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
