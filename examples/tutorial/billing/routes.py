"""Billing's routes, on Ferry's handler SDK: what each event does to billing's database.

The SDK checks the signature, parses the call, validates the payload against its schema,
claims the message id in the transaction the route runs in (a redelivery is answered 409
with nothing changed) and turns what the route raises into the contract's answer.
"""

from __future__ import annotations

import asyncpg

from shared.sdk import Call, Handler, Reject

from .payloads import MODELS, SCHEMAS, OrderPlacedV1

TABLES = [
    """
    CREATE TABLE IF NOT EXISTS invoices (
      order_id TEXT PRIMARY KEY,
      customer TEXT NOT NULL,
      amount_cents BIGINT NOT NULL,
      currency TEXT NOT NULL,
      message_id UUID NOT NULL,
      invoiced_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    "CREATE TABLE IF NOT EXISTS blocked_customers (customer TEXT PRIMARY KEY)",
]

handler = Handler("billing", schemas=SCHEMAS, models=MODELS, tables=TABLES)


@handler.route("order_placed", 1)
async def order_placed_v1(conn: asyncpg.Connection, call: Call[OrderPlacedV1]) -> None:
    """Invoice the order, unless its customer is blocked (422: dead-lettered, replayable)."""
    order = call.payload
    blocked = await conn.fetchval(
        "SELECT true FROM blocked_customers WHERE customer = $1", order.customer
    )
    if blocked:
        raise Reject("CUSTOMER_BLOCKED", f"customer {order.customer} is blocked")
    await conn.execute(
        "INSERT INTO invoices (order_id, customer, amount_cents, currency, message_id)"
        " VALUES ($1, $2, $3, $4, $5)",
        order.order_id,
        order.customer,
        order.amount_cents,
        order.currency,
        call.message_id,
    )
