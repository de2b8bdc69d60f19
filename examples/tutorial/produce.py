"""Place an order in the shop and record ``order_placed`` in the same transaction.

    python produce.py CUSTOMER AMOUNT_CENTS      # prints the event id

Reads SHOP_DSN (the shop's database) and FERRY_REGISTRY (the team's registry: the
producer API refuses an event the registry does not declare, or a payload its schema
refuses, before anything is written).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import asyncpg

from shared.adapters.producer import record_event

ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
  order_id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents BIGINT NOT NULL,
  currency TEXT NOT NULL, placed_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


async def place_order(conn: asyncpg.Connection, customer: str, amount_cents: int) -> str:
    """The order row and its event: both commit or neither does."""
    order_id = f"o-{uuid.uuid4().hex[:12]}"
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO orders (order_id, customer, amount_cents, currency)"
            " VALUES ($1, $2, $3, 'EUR')",
            order_id,
            customer,
            amount_cents,
        )
        event_id = await record_event(
            conn,
            aggregate_type="order",
            aggregate_id=order_id,
            event_type="order_placed",
            event_version=1,
            payload={
                "order_id": order_id,
                "customer": customer,
                "amount_cents": amount_cents,
                "currency": "EUR",
            },
        )
    return str(event_id)


async def main(customer: str, amount_cents: int) -> None:
    conn = await asyncpg.connect(os.environ["SHOP_DSN"])
    try:
        await conn.execute(ORDERS)
        print(await place_order(conn, customer, amount_cents))
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
