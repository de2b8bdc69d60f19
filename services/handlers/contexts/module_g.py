"""Module G: the archive worker (lane F→G, ``cg_g_archive``) and the replay requests it
records, both in G's database.

The archive is append-only. ``message_id`` is UNIQUE there as well, a second guard
behind ``handler_applied``: were the claim ever bypassed, the append would fail loudly
instead of archiving twice.

Module G's context also handles the replay API's jobs (``replay_job_requested`` v1,
durable ``cg_replay``). Executing them is the platform's, not this example's:
:mod:`shared.ops.replay_jobs`, bound by the handler role when FERRY_HANDLER_REPLAY_JOBS is
on. The manifest names the route here, so this module re-exports the unbound one.
"""

from __future__ import annotations

import uuid

from shared.adapters.postgres import Statement
from shared.contracts.events import handler_routes
from shared.ops.replay_jobs import replay_job_requested_v1

from ..fields import business_json, text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_g_archive (
      id BIGSERIAL PRIMARY KEY,
      message_id UUID NOT NULL UNIQUE,
      opportunity_key TEXT NOT NULL,
      archived_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS handler_g_replays (
      message_id UUID PRIMARY KEY,
      opportunity_key TEXT NOT NULL,
      payload JSONB NOT NULL,
      requested_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)


@one_statement
def opportunity_archived_v1(request: HandleRequest) -> Statement:
    """Append the archived opportunity."""
    return Statement(
        "INSERT INTO handler_g_archive (message_id, opportunity_key) VALUES ($1, $2)",
        (uuid.UUID(request.message_id), text(request.payload, "opportunity_key")),
    )


@one_statement
def replay_requested_v1(request: HandleRequest) -> Statement:
    """Record a replay request."""
    return Statement(
        "INSERT INTO handler_g_replays (message_id, opportunity_key, payload)"
        " VALUES ($1, $2, $3::jsonb)",
        (
            uuid.UUID(request.message_id),
            text(request.payload, "opportunity_key"),
            business_json(request.payload),
        ),
    )


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.module_g:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="module_g", tables=TABLES, routes=handler_routes(__name__, globals()))

__all__ = ["SPEC", "opportunity_archived_v1", "replay_job_requested_v1", "replay_requested_v1"]
