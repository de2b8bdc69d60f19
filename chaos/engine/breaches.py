"""A count's breaches as the report says them: one line per broken invariant."""

from __future__ import annotations


def flag(out: list[str], what: str, items: list[str], shown: int = 5) -> None:
    """Append ``what``, how many ``items`` and the first ``shown`` of them, when any."""
    if items:
        listed = ", ".join(items[:shown]) + (" …" if len(items) > shown else "")
        out.append(f"{what}: {len(items)} ({listed})")
