"""The status page's charts: inline SVG drawn on the server (no script, no library, no style attributes: colours
come from the page's one stylesheet through class names, so a strict Content-Security-Policy holds).

Each chart is a ``<figure data-chart="NAME" data-points="N">`` so a test can find it and count what it plots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Callable, Sequence

W, H = 640, 190                        # the viewBox; the page scales it to the column's width
LEFT, RIGHT, TOP, BOTTOM = 72, 14, 12, 26
PLOT_W, PLOT_H = W - LEFT - RIGHT, H - TOP - BOTTOM


PALETTE = ("c1", "c2", "c3", "c4", "c5", "c6")  # the classes of a chart's lines, one per series, in turn


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]   # (seconds before now, <= 0; value)
    css: str                                # the class that colours it: one of PALETTE, or budget


def colour(i: int) -> str:
    """The class of the ``i``-th of many series (the palette repeats past its end)."""
    return PALETTE[i % len(PALETTE)]


def nice_ceiling(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= v (1 for v <= 0)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= v * (1 - 1e-12):
            return float(step * mag)
    return float(10 * mag)


def ago(seconds: float) -> str:
    """-90 -> '1.5 min ago'; 0 -> 'now'."""
    s = abs(seconds)
    if s < 1:
        return "now"
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _x(t: float, span: float) -> float:
    return LEFT + PLOT_W * (1 + t / span)


def _y(v: float, top: float) -> float:
    return TOP + PLOT_H * (1 - v / top)


def _frame(name: str, title: str, n: int, body: list[str], legend: Sequence[tuple[str, str]]) -> str:
    keys = "".join(f'<li><span class="key {css}"></span>{escape(label)}</li>' for label, css in legend)
    return (f'<figure class="chart" data-chart="{escape(name)}" data-points="{n}">'
            f'<figcaption>{escape(title)}</figcaption>'
            f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(body) + f'</svg><ul class="legend">{keys}</ul></figure>')


def _y_axis(top: float, fmt: Callable[[float], str]) -> list[str]:
    out = []
    for frac in (0.0, 0.5, 1.0):
        y = _y(top * frac, top)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{escape(fmt(top * frac))}</text>')
    return out


def line_chart(name: str, title: str, series: Sequence[Series], span: float, fmt: Callable[[float], str],
               floor_top: float = 0.0) -> str:
    """Lines over the last ``span`` seconds; the y axis starts at 0 and ends at a round number above every
    value (and above ``floor_top``)."""
    span = max(span, 1.0)
    values = [v for s in series for _, v in s.points]
    top = nice_ceiling(max([floor_top, *values]) if values else floor_top)
    body = _y_axis(top, fmt)
    for t in (-span, -span / 2, 0.0):
        anchor = "start" if t == -span else "end" if t == 0 else "middle"
        body.append(f'<text class="tick" x="{_x(t, span):.1f}" y="{H - 6}" text-anchor="{anchor}">{ago(t)}</text>')
    n = 0
    for s in series:
        pts = [(_x(max(t, -span), span), _y(min(max(v, 0.0), top), top)) for t, v in s.points]
        n = max(n, len(pts))
        if len(pts) >= 2:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            body.append(f'<polyline class="line {s.css}" points="{coords}"><title>{escape(s.label)}</title></polyline>')
        if pts:
            x, y = pts[-1]
            body.append(f'<circle class="dot {s.css}" cx="{x:.1f}" cy="{y:.1f}" r="3"/>')
    if n < 2:
        body.append(f'<text class="empty" x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H / 2}" text-anchor="middle">'
                    "collecting: a point every few seconds</text>")
    return _frame(name, title, n, body, [(s.label, s.css) for s in series])


def stacked_bars(name: str, title: str, labels: Sequence[str], stacks: Sequence[Sequence[float]],
                 legend: Sequence[tuple[str, str]], fmt: Callable[[float], str]) -> str:
    """One bar per label, its parts stacked bottom up in ``legend``'s order (each part's class)."""
    n = len(labels)
    top = nice_ceiling(max((sum(parts) for parts in stacks), default=0.0))
    body = _y_axis(top, fmt)
    if n == 0:
        body.append(f'<text class="empty" x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H / 2}" text-anchor="middle">'
                    "no epoch sealed yet</text>")
    slot = PLOT_W / max(n, 1)
    bar = max(2.0, min(48.0, slot * 0.7))
    every = max(1, math.ceil(n / 16))  # at most 16 labels under the bars
    for i, (label, parts) in enumerate(zip(labels, stacks)):
        x = LEFT + slot * i + (slot - bar) / 2
        base = 0.0
        for value, (part, css) in zip(parts, legend):
            if value > 0:
                y0, y1 = _y(base + value, top), _y(base, top)
                body.append(f'<rect class="bar {css}" x="{x:.1f}" y="{y0:.1f}" width="{bar:.1f}" '
                            f'height="{max(y1 - y0, 0.5):.1f}"><title>{escape(label)}: {escape(fmt(value))} '
                            f'{escape(part)}</title></rect>')
            base += value
        if i % every == 0:
            body.append(f'<text class="tick" x="{x + bar / 2:.1f}" y="{H - 6}" text-anchor="middle">'
                        f'{escape(label)}</text>')
    return _frame(name, title, n, body, legend)
