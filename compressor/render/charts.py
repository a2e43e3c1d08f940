"""Small inline SVG charts for report.html: horizontal (stacked) bars and line charts.

Drawn by hand rather than with matplotlib: every run writes a report, and matplotlib's import
plus a figure's SVG cost seconds a run (measured 2.8 s import, 0.2-0.9 s a figure), which the
test suite pays on every compress call. The SVGs scale with the page (viewBox, width 100%) and
each bar / point carries a <title>, the tooltip a browser shows on hover or tap.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

# one colour per stored dtype, the same in every chart of a report
DTYPE_COLOURS = {"float32": "#4c78a8", "float16": "#72b7b2", "bfloat16": "#54a24b",
                 "int8": "#f58518", "uint8": "#e45756", "int4": "#b279a2", "uint4": "#ff9da6",
                 "int16": "#9d755d", "int32": "#bab0ac", "int64": "#79706e"}
OTHER_COLOUR = "#cccccc"
SERIES_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2")
WIDTH = 640
LABEL_W = 150          # room for row labels left of the bars
ROW_H = 22


def dtype_colour(dtype: str) -> str:
    return DTYPE_COLOURS.get(dtype, OTHER_COLOUR)


@dataclass
class Segment:
    value: float
    colour: str
    tip: str


@dataclass
class BarRow:
    label: str
    segments: list[Segment]
    note: str = ""                      # text right of the bar
    outline: float | None = None        # an unfilled bar drawn over it (e.g. the gzip size)


@dataclass
class Marker:
    value: float
    label: str
    colour: str = "#333333"


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    colour: str = SERIES_COLOURS[0]
    marks: list[float] = field(default_factory=list)   # x values drawn as a ringed point


def bar_chart(rows: Sequence[BarRow], markers: Sequence[Marker] = (), *, label: str,
              fmt: Callable[[float], str] = lambda v: f"{v:g}") -> str:
    """Horizontal bars, one per row, stacked from its segments; markers are vertical lines
    across all rows (a gate, the original size). `label` is the chart's accessible name."""
    top, note_w = 18 if markers else 6, 170
    height = top + ROW_H * len(rows) + 6
    span = max([sum(s.value for s in r.segments) for r in rows]
               + [r.outline or 0 for r in rows] + [m.value for m in markers] + [1e-12])
    scale = (WIDTH - LABEL_W - note_w) / span
    parts = []
    for i, row in enumerate(rows):
        y = top + i * ROW_H
        parts.append(_text(LABEL_W - 6, y + 15, _short(row.label), anchor="end"))
        x = float(LABEL_W)
        for seg in row.segments:
            w = max(seg.value * scale, 0.0)
            parts.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" '
                         f'fill="{seg.colour}"><title>{escape(seg.tip)}</title></rect>')
            x += w
        if row.outline is not None:
            parts.append(f'<rect x="{LABEL_W}" y="{y + 1}" width="{row.outline * scale:.1f}" '
                         f'height="{ROW_H - 2}" fill="none" stroke="#222" stroke-dasharray="3 2">'
                         f'<title>{escape(fmt(row.outline))}</title></rect>')
        end = max(x, LABEL_W + (row.outline or 0) * scale)
        parts.append(_text(end + 4, y + 15, row.note))
    for marker in markers:
        x = LABEL_W + marker.value * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 4}" '
                     f'stroke="{marker.colour}" stroke-width="1.5" stroke-dasharray="5 3">'
                     f'<title>{escape(marker.label)}</title></line>')
        parts.append(_text(x, top - 7, marker.label, anchor="middle", colour=marker.colour))
    # wrapped: on a phone the chart keeps a legible width and scrolls sideways in its box
    return f'<div class="scroll">{_svg(height, label, parts, css="chart wide")}</div>'


def line_chart(series: Sequence[Series], *, label: str, x_label: str, y_label: str,
               fmt: Callable[[float], str] = lambda v: f"{v:.4g}") -> str:
    """Points joined by lines per series on shared axes; `marks` ring chosen points."""
    width, height, left, bottom, top, right = 300, 180, 46, 30, 12, 10
    xs = [x for s in series for x, _ in s.points] or [0.0]
    ys = [y for s in series for _, y in s.points] or [0.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5 * (abs(y0) or 1), y1 + 0.5 * (abs(y1) or 1)

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - bottom - top)

    parts = [f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
             f'y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
             _text(left - 4, top + 8, fmt(y1), anchor="end", size=9),
             _text(left - 4, height - bottom, fmt(y0), anchor="end", size=9),
             _text(left, height - bottom + 12, f"{x0:g}", anchor="middle", size=9),
             _text(width - right, height - bottom + 12, f"{x1:g}", anchor="middle", size=9),
             _text((left + width) / 2, height - 4, x_label, anchor="middle", size=10),
             _text(4, top - 2, y_label, size=10)]
    for s in series:
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" '
                     'stroke-width="2"/>')
        for x, y in s.points:
            ring = x in s.marks
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{5 if ring else 2.5}" '
                         f'fill="{"#fff" if ring else s.colour}" stroke="{s.colour}" '
                         f'stroke-width="2"><title>{escape(s.name)} at {x_label} {x:g}: '
                         f'{escape(fmt(y))}{" (kept)" if ring else ""}</title></circle>')
    return _svg(height, label, parts, width=width)


def legend(entries: Sequence[tuple[str, str]]) -> str:
    """HTML swatches (colour, text) under a chart."""
    items = "".join(f'<span class="key"><i style="background:{colour}"></i>{escape(text)}</span>'
                    for colour, text in entries)
    return f'<div class="legend">{items}</div>'


def _svg(height: float, label: str, parts: list[str], width: int = WIDTH,
         css: str = "chart") -> str:
    return (f'<svg class="{css}" viewBox="0 0 {width} {height:.0f}" role="img" '
            f'aria-label="{escape(label)}">'   # inline in HTML5: no xmlns (no URL at all)
            + "".join(parts) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", colour: str = "#222",
          size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{colour}">{escape(text)}</text>')


def _short(text: str, limit: int = 22) -> str:
    """Long tensor names keep their tail (the part that tells layers apart)."""
    return text if len(text) <= limit else "…" + text[-(limit - 1):]
