"""One event's journey: every hop of it, from the outbox to its handlers (what ``ferry where
MESSAGE_ID`` — shared/cli/where.py — and the console's event page show).

Read-only, across every database and stream of the topology:

1. **outbox** — which context recorded it, when, whether and when it was published, after
   how many attempts, the last publish error;
2. **stream** — the stream, sequence and time JetStream stored it at (found through an
   inbox row's sequence, else by scanning the stream from the publish time);
3. per **durable** whose filters take the subject (:meth:`Topology.delivers`, partition
   tokens included) — JetStream's delivery state (pending, delivered, acknowledged; on the
   consumer of the event's partition for an ordered durable), the inbox row (status,
   attempts, last error, handler status, retry history, duplicates), the handler's own
   call ledger where the example handler services keep one, and the **dead letter** with
   its replays and operator actions;
4. per durable declared ``ordering: key`` — the event's **ordering key** (read from the
   outbox row, else the stored message, else its parked row), its **partition** on a
   partitioned stream, and, while it is parked (``parked_messages``), its state (queued,
   retrying, held), attempts, next attempt, how many of its key's parked messages are
   before and after it and the head it waits behind; an event not parked itself whose key
   is shows the key's head;
5. the **trace id** (with a link when ``FERRY_TRACE_URL`` is set).

The pieces live beside it: :mod:`shared.ops.where_rows` (the database reads),
:mod:`shared.ops.where_stream` (the subject and the stream lookups),
:mod:`shared.ops.where_durables` (per durable: delivery state, ordering key, parked queue)
and :mod:`shared.ops.where_render` (the journey as text); this module puts the journey
together (:func:`journey`).
"""

from __future__ import annotations

import uuid
from typing import Any

from shared.adapters.nats import NatsClient, connect_nats
from shared.contracts.topology import Topology
from shared.ops.where_durables import durables
from shared.ops.where_rows import database_rows
from shared.ops.where_stream import locate
from shared.runtime.settings import CommonSettings
from shared.telemetry import parse_traceparent


async def journey(
    settings: CommonSettings,
    topology: Topology,
    message_id: uuid.UUID,
    nc: NatsClient | None = None,
) -> Any:
    """Everything known about ``message_id`` in ``topology``, as a JSON-able document.

    ``nc``: a connection of the caller's to read the streams with (the console's own,
    left open); without it (or when it is not connected) the journey opens one of its
    own and closes it."""
    doc: dict[str, Any] = {"message_id": str(message_id), "topology": topology.name}
    rows = await database_rows(settings, topology, message_id)
    doc["outbox"] = rows["outbox"]
    own = nc is None or not nc.is_connected
    if own:
        nc = await connect_nats(
            settings.nats_servers(), name="ferry-where", auth=settings.nats_auth(), give_up_after=10
        )
    assert nc is not None
    try:
        doc["stream"] = await locate(nc, topology, doc["outbox"], rows, message_id)
        doc["durables"] = await durables(settings, nc, topology, doc, rows)
    finally:
        if own:
            await nc.close()
    doc["trace"] = _trace(settings, doc, rows)
    doc["found"] = bool(doc["outbox"] or rows["inbox"] or rows["dead"] or doc["stream"])
    return doc


def _trace(settings: CommonSettings, doc: dict[str, Any], rows: dict[str, Any]) -> Any:
    candidates = [
        (doc["outbox"] or {}).get("traceparent"),
        *(r.get("traceparent") for r in rows["inbox"].values()),
        *(r.get("traceparent") for r in rows["dead"].values()),
        (doc["stream"] or {}).get("traceparent"),
    ]
    for traceparent in candidates:
        ids = parse_traceparent(traceparent)
        if ids is not None:
            trace: dict[str, Any] = {"trace_id": ids[0], "traceparent": traceparent}
            if settings.trace_url_template:
                trace["url"] = settings.trace_url_template.replace("{trace_id}", ids[0])
            return trace
    return None
