"""Rewind tests reuse the consumer tests' scripted handler (the independent record)."""

from __future__ import annotations

from tests.consumer.conftest import handler

__all__ = ["handler"]
