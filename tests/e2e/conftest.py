"""End-to-end tests reuse the consumer tests' scripted handler."""

from __future__ import annotations

from tests.consumer.conftest import handler

__all__ = ["handler"]
