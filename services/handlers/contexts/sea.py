"""SEA's handler: VibesPro's ``vibe_created`` v1 and v2, routed side by side (INV-023).

v2 adds ``owner_id``; v1 knows nothing about owners, so it stores NULL for a new vibe
and leaves an owner already known (from a v2) in place rather than erasing it.
"""

from __future__ import annotations

from shared.adapters.postgres import Statement
from shared.contracts.events import handler_routes

from ..fields import text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_sea_vibes (
      vibe_id TEXT PRIMARY KEY,
      title TEXT NOT NULL,
      owner_id TEXT,
      version INT NOT NULL,
      updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)

_UPSERT = """
INSERT INTO handler_sea_vibes (vibe_id, title, owner_id, version, updated_at)
VALUES ($1, $2, $3, $4, clock_timestamp())
ON CONFLICT (vibe_id) DO UPDATE SET
  title = EXCLUDED.title,
  owner_id = COALESCE(EXCLUDED.owner_id, handler_sea_vibes.owner_id),
  version = EXCLUDED.version,
  updated_at = EXCLUDED.updated_at
"""


@one_statement
def vibe_created_v1(request: HandleRequest) -> Statement:
    """Store a vibe without an owner."""
    payload = request.payload
    return Statement(_UPSERT, (text(payload, "vibe_id"), text(payload, "title"), None, 1))


@one_statement
def vibe_created_v2(request: HandleRequest) -> Statement:
    """Store a vibe with its owner."""
    payload = request.payload
    return Statement(
        _UPSERT, (text(payload, "vibe_id"), text(payload, "title"), text(payload, "owner_id"), 2)
    )


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.sea:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="sea", tables=TABLES, routes=handler_routes(__name__, globals()))
