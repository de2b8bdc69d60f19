"""Billing's handler service: a FastAPI application around the SDK's ``/handle``.

    BILLING_DSN=postgresql://.../billing FERRY_HANDLER_SECRETS='{"billing__from_shop": "…"}' \
        uvicorn billing.app:app --port 8300
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from fastapi import FastAPI, HTTPException, Response

from shared.sdk import load_secrets
from shared.sdk.asgi import handle_endpoint

from .routes import handler


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    pool = await asyncpg.create_pool(os.environ["BILLING_DSN"], min_size=1, max_size=10)
    handler.bind(pool)
    await handler.install()  # the claim table and TABLES
    try:
        yield
    finally:
        await pool.close()


app = FastAPI(title="billing", lifespan=lifespan)
app.add_api_route("/handle", handle_endpoint(handler, secrets=load_secrets()), methods=["POST"])


@app.get("/readyz")
async def readyz(response: Response) -> dict[str, bool]:
    ready = await handler.ready()
    response.status_code = 200 if ready else 503
    return {"ready": ready}


@app.get("/invoices/{order_id}")
async def invoice(order_id: str) -> dict[str, Any]:
    row = await handler.pool.fetchrow("SELECT * FROM invoices WHERE order_id = $1", order_id)
    if row is None:
        raise HTTPException(404, f"no invoice for order {order_id}")
    return {k: str(v) if k in ("message_id", "invoiced_at") else v for k, v in row.items()}
