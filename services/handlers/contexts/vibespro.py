"""VibesPro's handler: SEA's ``model_published`` v1."""

from __future__ import annotations

from shared.adapters.postgres import Statement
from shared.contracts.events import handler_routes

from ..fields import text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_vibespro_models (
      model_id TEXT PRIMARY KEY,
      name TEXT NOT NULL,
      updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)


@one_statement
def model_published_v1(request: HandleRequest) -> Statement:
    """Store (or rename) a published model."""
    payload = request.payload
    return Statement(
        "INSERT INTO handler_vibespro_models (model_id, name, updated_at)"
        " VALUES ($1, $2, clock_timestamp())"
        " ON CONFLICT (model_id) DO UPDATE"
        " SET name = EXCLUDED.name, updated_at = EXCLUDED.updated_at",
        (text(payload, "model_id"), text(payload, "name")),
    )


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.vibespro:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="vibespro", tables=TABLES, routes=handler_routes(__name__, globals()))
