"""Module H's config-publish worker (``cg_h_publish``): ``config_publish_requested`` v1.

Each config keeps its highest revision: a request for an older revision arriving late
(redelivery, replay) is processed (200) but changes nothing, so replays cannot roll a
published config back.
"""

from __future__ import annotations

from shared.adapters.postgres import Statement
from shared.contracts.events import handler_routes

from ..fields import business_json, integer, text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_h_configs (
      config_id TEXT PRIMARY KEY,
      revision BIGINT NOT NULL,
      payload JSONB NOT NULL,
      updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)


@one_statement
def config_publish_requested_v1(request: HandleRequest) -> Statement:
    """Publish a config revision unless a newer one is already published."""
    return Statement(
        "INSERT INTO handler_h_configs (config_id, revision, payload, updated_at)"
        " VALUES ($1, $2, $3::jsonb, clock_timestamp())"
        " ON CONFLICT (config_id) DO UPDATE"
        " SET revision = EXCLUDED.revision, payload = EXCLUDED.payload,"
        " updated_at = EXCLUDED.updated_at"
        " WHERE EXCLUDED.revision > handler_h_configs.revision",
        (
            text(request.payload, "config_id"),
            integer(request.payload, "revision"),
            business_json(request.payload),
        ),
    )


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.module_h:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="module_h", tables=TABLES, routes=handler_routes(__name__, globals()))
