"""The guard of handlers that rely on per-key order: an out-of-order event made visible.

A durable declared ``ordering: key`` hands a handler the events of one key one at a time,
in stream order, so a route applies each event as it arrives — the later one wins — and
no longer keeps "the highest revision" to survive reordering. Should the order ever be
broken (a replay after ``on_dead_letter: skip``, a misdeclared durable, a consumer bug),
the route still applies the event in arrival order, but reports it here: a warning
naming the key and both revisions, and ``ferry_handler_out_of_order_total`` counted.
"""

from __future__ import annotations

import logging
from collections import Counter

from .request import HandleRequest

log = logging.getLogger("ferry.handlers")

#: Out-of-order events reported in this process, by (handler, event type).
_REPORTED: Counter[tuple[str, str]] = Counter()


def report_out_of_order(
    request: HandleRequest, *, handler: str, key: str, revision: int, previous: int
) -> None:
    """Log and count an event whose ``revision`` is below the ``previous`` one applied."""
    event_type = request.envelope.event_type
    _REPORTED[(handler, event_type)] += 1
    log.warning(
        "out-of-order event applied: %s %s revision %d arrived after revision %d"
        " (per-key order was broken upstream)",
        event_type,
        key,
        revision,
        previous,
        extra={
            "message_id": request.message_id,
            "handler": handler,
            "stream_sequence": request.delivery.stream_sequence,
        },
    )


def reported(handler: str) -> dict[tuple[str, ...], float]:
    """``(handler, event_type)`` → out-of-order events reported so far, for ``handler``."""
    return {key: float(count) for key, count in _REPORTED.items() if key[0] == handler}
