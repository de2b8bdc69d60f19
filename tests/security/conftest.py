"""Security tests reuse the consumer tests' scripted handler and world."""

from __future__ import annotations

from tests.consumer.conftest import handler, world

__all__ = ["handler", "world"]
