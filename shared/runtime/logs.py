"""Logs: one JSON object per line on stderr.

Each line holds time, level, role, logger, message, and any ``extra`` fields such as
durable or message_id, plus trace_id/span_id and the fields of
:func:`shared.telemetry.log_fields`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from shared.telemetry import log_context

_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "role": self.role,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(log_context())
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


#: asyncio's warning when a peer ends a TLS connection (its stream protocol asks to keep
#: the transport half-open, which TLS cannot; asyncio/sslproto.py): said of every TLS
#: connection a server closes, and meaning nothing.
_TLS_EOF_NOISE = "returning true from eof_received() has no effect when using ssl"


def _not_tls_eof_noise(record: logging.LogRecord) -> bool:
    return not (record.name == "asyncio" and record.getMessage() == _TLS_EOF_NOISE)


def configure_logging(role: str, level: str = "INFO") -> None:
    """JSON lines on stderr for ``role``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role))
    handler.addFilter(_not_tls_eof_noise)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
