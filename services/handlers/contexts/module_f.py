"""Module F's ingest worker (lane E→F, ``cg_f_ingest``): ``opportunity_scored`` v1.

It stores the score and, in the SAME statement, records ``opportunity_archived`` v1
in F's own outbox (:func:`shared.adapters.producer.event_statement`): that is what feeds lane
F→G. Either both commit or neither, and the claim in ``handler_applied`` commits with
them (one statement, one round trip), so a redelivery can neither lose the forwarded
event nor forward it twice.
"""

from __future__ import annotations

from shared.adapters.postgres import Statement
from shared.adapters.producer import event_statement
from shared.contracts.events import handler_routes
from shared.domain.errors import OutboxValidationError, PoisonError

from ..fields import number, text
from ..request import HandleRequest
from ..service import ServiceSpec, one_statement

TABLES = (
    """
    CREATE TABLE IF NOT EXISTS handler_f_opportunities (
      opportunity_key TEXT PRIMARY KEY,
      score DOUBLE PRECISION NOT NULL,
      updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )
    """,
)


@one_statement
def opportunity_scored_v1(request: HandleRequest) -> Statement:
    """Upsert the opportunity's score and forward ``opportunity_archived`` through F's outbox."""
    key = text(request.payload, "opportunity_key")
    upsert = Statement(
        "INSERT INTO handler_f_opportunities (opportunity_key, score, updated_at)"
        " VALUES ($1, $2, clock_timestamp())"
        " ON CONFLICT (opportunity_key) DO UPDATE"
        " SET score = EXCLUDED.score, updated_at = EXCLUDED.updated_at",
        (key, number(request.payload, "score")),
    )
    envelope = request.envelope
    try:
        _, statement = event_statement(
            upsert,
            aggregate_type="opportunity",
            aggregate_id=key,
            event_type="opportunity_archived",
            payload={"opportunity_key": key},
            causation_id=envelope.message_id,
            correlation_id=envelope.correlation_id or envelope.message_id,
            traceparent=request.traceparent,
        )
    except OutboxValidationError as exc:
        # The producer API refuses what could never be published; for this event that
        # can only come from the incoming payload, so it is poison, not a retry.
        raise PoisonError("INVALID_OUTPUT", f"cannot forward: {exc}") from exc
    return statement


#: Routes come from the generated registry: the manifests name each version's handler
#: (``handler: services.handlers.contexts.module_f:<function>``); changing one means regenerating.
SPEC = ServiceSpec(name="module_f", tables=TABLES, routes=handler_routes(__name__, globals()))
