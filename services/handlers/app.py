"""The HTTP face of an example handler service: the SDK's aiohttp adapter
(:func:`shared.sdk.aiohttp_app.aiohttp_app`: ``POST /handle``, ``GET /healthz``,
``GET /readyz``) with Ferry's spans, ``/metrics`` and the out-of-order counter added.

The application installs the service's tables on startup, so it is ready to serve as soon
as the runner is set up.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from shared.domain.signing import DEFAULT_TOLERANCE
from shared.runtime.metrics import counter_family
from shared.sdk.aiohttp_app import aiohttp_app

from .metrics import observe_app
from .ordering import reported
from .service import HandlerService


def make_app(
    *,
    service: HandlerService,
    secrets: Mapping[str, bytes] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> web.Application:
    """An aiohttp application serving ``service`` under the handler contract.

    With ``secrets`` (durable → secret), every ``POST /handle`` must carry a valid
    signature (:mod:`shared.domain.signing`) or it is refused with 401; without, calls
    are not authenticated (``python -m services.handlers`` warns at start).
    """
    app = aiohttp_app(service, secrets=secrets, tolerance=tolerance, allow_unsigned=True)
    metrics = observe_app(app, role=f"handler-{service.name}")  # spans, /metrics
    metrics.add_collector(
        lambda: [
            counter_family(
                "ferry_handler_out_of_order",
                "Events applied although their revision was below the one they replaced "
                "(per-key order broken upstream).",
                ["handler", "event_type"],
                reported(service.name),
            )
        ]
    )
    return app
