"""The payload models of a handler service (``ferry handler-models``,
shared/cli/handler_models.py).

For every event the topology (FERRY_TOPOLOGY) sends to a context — handled by a durable
that targets it — a pydantic model generated from the event's JSON Schema, and the
``MODELS`` and ``SCHEMAS`` tables an SDK :class:`~shared.sdk.Handler` takes
(:mod:`shared.sdk.models`); written to a file, or compared with it (a CI step for the
team).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from shared.runtime.settings import CommonSettings
from shared.sdk.models import EventSchema, generate_models
from shared.sdk.topology_events import handled_events

#: What became of a models file: written, or (compared) up to date or stale.
Status = Literal["written", "up_to_date", "stale"]


def models_source(settings: CommonSettings, context: str) -> str:
    """The generated module for ``context`` under the configured topology."""
    topology = settings.load_topology()
    topology.context(context)
    events = [
        EventSchema(key[0], key[1], event.payload_schema or {}, event.description or "")
        for key, event in handled_events(topology, context).items()
    ]
    return generate_models(events, source=f"topology {topology.name!r}, context {context!r}")


def write_models(source: str, path: Path, *, check: bool = False) -> Status:
    """Write ``source`` to ``path``, or (``check``) compare it with what ``path`` holds."""
    if check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        return "up_to_date" if current == source else "stale"
    path.write_text(source, encoding="utf-8")
    return "written"
