"""What the console's pages share: the error a user sees, form fields, template filters,
the overview's sparkline samples and the trace timeline."""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from shared.ops.where_render import place_text

from .overview import THRESHOLDS, Overview
from .svg import sparkline

#: The sparklines' span (seconds).
HOUR = 3600.0


#: Longest run of text a page repeats from a user's input (the rest is counted, not shown).
ECHO_LIMIT = 200
#: Longest message an error page shows.
MESSAGE_LIMIT = 1000


def capped(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as a page repeats it: its first ``limit`` characters, then how many
    there were (an input of 5,000 characters is not shown in full)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def capped_message(message: str) -> str:
    """An error message as a page shows it: every word longer than :data:`ECHO_LIMIT`
    capped (a long input is one word), the whole at most :data:`MESSAGE_LIMIT`."""
    words = [capped(word) for word in message.split(" ")]
    return capped(" ".join(words), MESSAGE_LIMIT)


class UserError(Exception):
    """Bad input or a refused action: shown to the user as is, with an HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Samples:
    """The overview's figures over the last hour, in memory (for the sparklines)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.series: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self.last = 0.0

    def add(self, overview: Overview) -> None:
        """Record one overview's figures (at most one sample per half interval)."""
        now = time.time()
        if now - self.last < self.interval / 2:
            return
        self.last = now
        keep = int(HOUR / self.interval) + 2
        for ctx in overview.contexts:
            self._put(("outbox_backlog", ctx.name), now, ctx.backlog, keep)
            self._put(("outbox_oldest_age", ctx.name), now, ctx.oldest_age or 0.0, keep)
        for view in overview.durables:
            if view.lag_messages is not None:
                self._put(("lag_messages", view.name), now, view.lag_messages, keep)
                self._put(("lag_seconds", view.name), now, view.lag_seconds or 0.0, keep)
            self._put(("rate", view.name), now, view.rate, keep)
            if view.success_ratio is not None:
                self._put(("success_ratio", view.name), now, view.success_ratio, keep)
            self._put(("dead_open", view.name), now, view.dead_open, keep)

    def _put(self, key: tuple[str, str], at: float, value: float, keep: int) -> None:
        series = self.series.setdefault(key, deque(maxlen=keep))
        series.append((at, float(value)))

    def svg(self, kind: str, name: str, label: str, floor_top: float = 1.0) -> str:
        """The sparkline of one series, with its alert threshold: the last hour, or since
        the first sample when the console has run for less."""
        points = list(self.series.get((kind, name), ()))
        now = time.time()
        since = points[0][0] if points else now - HOUR
        return sparkline(
            points,
            span=max(min(HOUR, now - since), 2 * self.interval),
            now=now,
            threshold=THRESHOLDS.get(kind),
            floor_top=floor_top,
            label=label,
        )


def filters() -> dict[str, Any]:
    """The templates' filters, by name."""
    return {"when": when, "age": age, "num": num, "pct": pct, "short": short,
            "q": lambda value: quote(str(value), safe=""),
            # Where the event is for a durable, as `ferry where` says it (whereabouts).
            "place": place_text,
            # Text repeated from a user's input: capped (see capped_message).
            "capped": capped_message}  # fmt: skip


def timeline(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans as rows of a timeline: offset and width in % of the trace, depth, service."""
    rows = []
    for span in spans:
        try:
            start = _span_time(span["start_time"])
            end = _span_time(span["end_time"])
        except (KeyError, ValueError, TypeError):
            continue
        rows.append(
            {
                "name": str(span.get("name", "?")),
                "service": str(
                    (span.get("resource") or {}).get("attributes", {}).get("service.name", "?")
                ),
                "span_id": (span.get("context") or {}).get("span_id"),
                "parent_id": span.get("parent_id"),
                "start": start,
                "end": max(end, start),
                "status": (span.get("status") or {}).get("status_code", "UNSET"),
            }
        )
    if not rows:
        return []
    rows.sort(key=lambda r: r["start"])
    first = rows[0]["start"]
    last = max(r["end"] for r in rows)
    total = max((last - first).total_seconds(), 1e-6)
    by_id = {r["span_id"]: r for r in rows}
    for row in rows:
        depth, parent = 0, by_id.get(row["parent_id"])
        while parent is not None and depth < 20:
            depth, parent = depth + 1, by_id.get(parent["parent_id"])
        row["depth"] = depth
        row["offset"] = 100 * (row["start"] - first).total_seconds() / total
        row["width"] = max(100 * (row["end"] - row["start"]).total_seconds() / total, 0.4)
        row["ms"] = (row["end"] - row["start"]).total_seconds() * 1000
        row["at_ms"] = (row["start"] - first).total_seconds() * 1000
    return rows


def _span_time(text: str) -> datetime:
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def field(source: Any, name: str) -> str | None:
    """A form or query field as text; None when absent or not text."""
    value = source.get(name) if source is not None else None
    return value if isinstance(value, str) else None


def rate_param(text: str | None, default: float) -> float:
    """A replay rate from a form (replays per second, above 0, at most 100)."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"the rate {text!r} is not a number (replays per second)") from None
    if not 0 < value <= 100:
        raise UserError("the rate must be above 0 and at most 100 replays per second")
    return value


def safe_next(target: str | None) -> str:
    """A redirect target inside the console (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def plain_name(text: str) -> bool:
    """A path component safe to join (letters, digits, ``-_.T:+``, no ``..``)."""
    return bool(text) and all(c.isalnum() or c in "-_.T:+" for c in text) and ".." not in text


def when(value: Any) -> str:
    """A moment as UTC ``YYYY-MM-DD HH:MM:SS`` (template filter)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def age(seconds: Any) -> str:
    """Seconds as s, min or h (template filter)."""
    if seconds is None:
        return "-"
    value = float(seconds)
    if value < 60:
        return f"{value:.0f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def num(value: Any) -> str:
    """A number with thousands separators (template filter)."""
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def pct(value: Any) -> str:
    """A ratio as a percentage (template filter)."""
    return "-" if value is None else f"{100 * float(value):.1f} %"


def short(text: Any, width: int = 140) -> str:
    """Text on one line, cut at ``width`` characters (template filter)."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
