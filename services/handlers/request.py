"""What a route of the example handlers receives: the SDK's :class:`~shared.sdk.Call`,
with the payload as a ``dict`` (the example routes read it with :mod:`.fields`).

Parsing and checking a call is the SDK's (:mod:`shared.sdk.request`): one implementation
of the contract for Ferry's handlers and everyone else's.
"""

from __future__ import annotations

from typing import Any

from shared.sdk import Call

#: A call as the example routes see it. With fault injection on, its ``payload`` is
#: without ``_ferry_test`` (:class:`~services.handlers.faults.FaultInjection`).
HandleRequest = Call[dict[str, Any]]

__all__ = ["HandleRequest"]
