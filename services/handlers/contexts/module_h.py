"""Module H's config-publish worker (``cg_h_publish``): ``config_publish_requested`` v1.

``cg_h_publish`` is declared ``ordering: key`` on the config: the consumer hands this
handler the requests of one config one at a time, in the order the controller committed
them. So each request is applied as it arrives — the later request wins, whatever its
revision, which is how a controller rolls a config back — instead of keeping "the
highest revision" to survive reordering. Idempotency stays per message id (the claim in
``handler_applied``): a redelivery of a request already applied is a 409 and changes
nothing.

The guard: each row keeps the revision it replaced (``previous_revision``, written by the
same statement, so it is exact under any concurrency). A request whose revision is below
the one it replaces is still applied in arrival order, but logged and counted
(``ferry_handler_out_of_order_total``, :mod:`services.handlers.ordering`): a broken order
upstream is visible, not silently absorbed.
"""

from __future__ import annotations

from shared.adapters.postgres import Conn
from shared.contracts.events import handler_routes

from ..fields import business_json, integer, text
from ..ordering import report_out_of_order
from ..request import HandleRequest
from ..service import ServiceSpec

NAME = "module_h"

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_h_configs (
      config_id TEXT PRIMARY KEY,
      revision BIGINT NOT NULL,
      payload JSONB NOT NULL,
      updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
    # Added after the table first shipped: the revision the last request replaced.
    "ALTER TABLE handler_h_configs ADD COLUMN IF NOT EXISTS previous_revision BIGINT",
)

_PUBLISH = """
INSERT INTO handler_h_configs (config_id, revision, payload, updated_at)
VALUES ($1, $2, $3::jsonb, clock_timestamp())
ON CONFLICT (config_id) DO UPDATE SET
  previous_revision = handler_h_configs.revision,
  revision = EXCLUDED.revision,
  payload = EXCLUDED.payload,
  updated_at = EXCLUDED.updated_at
RETURNING previous_revision
"""


async def config_publish_requested_v1(conn: Conn, request: HandleRequest) -> None:
    """Publish the requested revision (arrival order wins); report one that goes back."""
    config_id = text(request.payload, "config_id")
    revision = integer(request.payload, "revision")
    previous = await conn.fetchval(_PUBLISH, config_id, revision, business_json(request.payload))
    if previous is not None and revision < previous:
        report_out_of_order(
            request, handler=NAME, key=config_id, revision=revision, previous=previous
        )


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.module_h:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name=NAME, tables=TABLES, routes=handler_routes(__name__, globals()))
