"""What a topology sends one context: the events its durables deliver there, and their
payload schemas (the handler service's routes and checks are built from them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.contracts.topology import EventSpec, Topology

from .routes import RouteKey


def handled_events(topology: Topology, context: str) -> dict[RouteKey, EventSpec]:
    """Events ``topology`` sends to ``context`` (handled by a durable targeting it)."""
    durables = {name for name, d in topology.durables.items() if d.target == context}
    return {
        (event.type, event.version): event
        for event in topology.events
        if durables.intersection(event.handled_by)
    }


def topology_schemas(topology: Topology, context: str) -> dict[RouteKey, Mapping[str, Any]]:
    """The payload schemas of the events ``topology`` sends to ``context``."""
    return {
        key: event.payload_schema
        for key, event in handled_events(topology, context).items()
        if event.payload_schema is not None
    }
