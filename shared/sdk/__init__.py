"""Ferry's handler SDK: the handler contract for Python services outside Ferry's tree.

A handler service answers the inbox-consumer's signed ``POST /handle`` calls
(docs/reference/handler-contract.md). The SDK does the contract's part of it::

    from shared.sdk import Handler, Call, load_secrets
    from shared.sdk.asgi import asgi_app            # the ``sdk`` extra (Starlette/FastAPI)
    from payloads import MODELS, SCHEMAS, OrderPaidV1   # ferry handler-models shop ...

    handler = Handler("billing", schemas=SCHEMAS, models=MODELS, tables=[DDL])

    @handler.route("order_paid", 1)
    async def order_paid(conn, call: Call[OrderPaidV1]) -> None:
        await conn.execute("INSERT INTO invoices ...", call.payload.order_id)

    app = asgi_app(handler, secrets=load_secrets(), dsn=DSN)

* the signature is checked first: 401 when missing, forged or stale (:mod:`.auth`);
* the request becomes a :class:`Call` (envelope, ``delivery``, typed payload); a
  malformed one is 400, an unknown event or a payload its schema refuses 422
  (:mod:`.request`, :mod:`.handler`, :mod:`.models`);
* the route runs in the transaction that claims the message id (:mod:`.store`): a
  duplicate is 409 with nothing changed, a failure rolls back the effect and the claim;
* what the route raises picks the status (:mod:`.outcomes`): :class:`Reject` 422,
  :class:`Retry` 503/429 with ``Retry-After``, :class:`GiveUp` 500 ``retryable: false``;
* adapters: :func:`~shared.sdk.aiohttp_app.aiohttp_app` and
  :func:`~shared.sdk.asgi.asgi_app`; a signing test client: :mod:`.testing`.
"""

from shared.sdk.auth import authenticate, load_secrets
from shared.sdk.handler import Handler, Hook, one_statement
from shared.sdk.outcomes import GiveUp, Outcome, Reject, Retry
from shared.sdk.request import Call, Delivery, MalformedRequest, parse_call
from shared.sdk.store import CLAIMS_DDL, claim
from shared.sdk.topology_events import handled_events, topology_schemas

__all__ = [
    "CLAIMS_DDL",
    "Call",
    "Delivery",
    "GiveUp",
    "Handler",
    "Hook",
    "MalformedRequest",
    "Outcome",
    "Reject",
    "Retry",
    "authenticate",
    "claim",
    "handled_events",
    "load_secrets",
    "one_statement",
    "parse_call",
    "topology_schemas",
]
