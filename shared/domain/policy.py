"""Pure outbox policy the adapter, the settings and the lint share: retry cap, timing.

Numbers only, no I/O, so the contracts layer (the lint) can reason about them without
importing an adapter or the settings. (The dead-letter policy — reasons not replayable,
replay back-off, where a dead letter starts — is :mod:`shared.domain.dead_letter`'s.)

Phase 1 of issue 27: ``shared/adapters/outbox.py`` still holds its own
``ROW_RETRY_CAP_SECONDS`` (other work was editing it); ``tests/unit/test_policy.py`` pins the
two equal until the adapter imports this one.
"""

from __future__ import annotations

#: Longest back-off between attempts of one failing outbox row (the claim's SQL uses it).
ROW_RETRY_CAP_SECONDS = 60

#: An outbox-publisher's default seconds to wait for a PubAck before the row is retried.
PUBLISH_TIMEOUT = 5.0
#: Its default longest pause after a failed batch.
RETRY_MAX = 5.0
#: Its default polling fallback when no NOTIFY arrives.
POLL_INTERVAL = 1.0
