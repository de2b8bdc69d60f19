"""Why a hop is failing, for ``/readyz`` (issue 47): the last error each hop of this
process met — ``postgres``, ``nats``, ``handler`` — until it works again.

A role that cannot reach a server keeps trying and holds its work; what an operator needs
then is which hop and why (a refused certificate, a password, a closed port) without
reading the logs. The adapters report here when a connection attempt or a call fails and
clear it when one succeeds; the health server lists what is set. Process-wide and tiny on
purpose: a dict of short strings, written on failures and on the first success after one.
"""

from __future__ import annotations

import time

#: hop -> (why, since when: Unix time).
_FAILING: dict[str, tuple[str, float]] = {}
#: Longest reason kept (one line of a health answer).
MAX_REASON = 300


def report(hop: str, why: str) -> None:
    """``hop`` failed, for ``why`` (kept from the first failure's time until it works)."""
    since = _FAILING.get(hop, ("", time.time()))[1]
    _FAILING[hop] = (" ".join(why.split())[:MAX_REASON], since)


def clear(hop: str) -> None:
    """``hop`` works (again)."""
    _FAILING.pop(hop, None)


def failing() -> dict[str, dict[str, object]]:
    """Every failing hop: its reason and since when (seconds ago)."""
    now = time.time()
    return {
        hop: {"why": why, "for_seconds": round(now - since, 1)}
        for hop, (why, since) in sorted(_FAILING.items())
    }
