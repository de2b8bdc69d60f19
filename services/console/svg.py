"""Sparklines as inline SVG, drawn on the server (no script, no image request).

A sparkline is a polyline of the samples over the last hour, scaled to the larger of the
highest sample and the alert threshold, with the threshold drawn as a dashed red line
(the page's CSS colours it) and the latest value as a dot.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, PAD = 160, 36, 3


def sparkline(
    points: Sequence[tuple[float, float]],
    *,
    span: float,
    now: float,
    threshold: float | None = None,
    floor_top: float = 1.0,
    label: str = "",
) -> str:
    """``points`` (time, value) of the last ``span`` seconds before ``now`` as an SVG."""
    recent = [(t, v) for t, v in points if now - span <= t <= now]
    top = max([v for _, v in recent] + [threshold or 0.0, floor_top])
    title = f"<title>{escape(label)}</title>" if label else ""

    def x(t: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * (1 - (now - t) / span)

    def y(v: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * (max(v, 0.0) / top)

    parts = [
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}">{title}',
        f'<rect class="frame" x="0.5" y="0.5" width="{WIDTH - 1}" height="{HEIGHT - 1}"/>',
    ]
    if threshold is not None:
        ty = round(y(threshold), 1)
        parts.append(
            f'<line class="threshold" x1="{PAD}" y1="{ty}" x2="{WIDTH - PAD}" y2="{ty}">'
            f"<title>alert threshold {threshold:g}</title></line>"
        )
    if len(recent) >= 2:
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in recent)
        parts.append(f'<polyline class="line" points="{coords}"/>')
    if recent:
        t, v = recent[-1]
        parts.append(f'<circle class="last" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2"/>')
    else:
        parts.append(f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2 + 4}">no samples</text>')
    parts.append("</svg>")
    return "".join(parts)
