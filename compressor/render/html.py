"""Self-contained HTML pages: report.html (every run) and sweep.html (`compress sweep`).

One file each, CSS inline, charts inline SVG, a few lines of vanilla JS to sort tables; no URL
of any kind, so a page works from file://, as a CI artifact and offline. Table cells carry the
raw number in `data-value` (what sorting and the tests read); the text is for people.
"""
from __future__ import annotations

from collections.abc import Sequence
from html import escape
from importlib import resources
from typing import Any

# Sorts the clicked column of a table.sortable by each cell's data-value (numbers) or text.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      function key(row) {
        var cell = row.cells[col], raw = cell.getAttribute("data-value");
        var num = parseFloat(raw === null ? cell.textContent : raw);
        return isNaN(num) ? cell.textContent.toLowerCase() : num;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def page(title: str, body: Sequence[str], sortable: bool = False) -> str:
    """The whole document: head with the inline stylesheet, the sections, the sort script."""
    css = resources.files("compressor.render").joinpath("style.css").read_text()
    script = f"<script>{SORT_SCRIPT}</script>" if sortable else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{css}</style></head><body>"
            + "\n".join(part for part in body if part) + script + "</body></html>\n")


def section(key: str, heading: str, *parts: str) -> str:
    return (f'<section id="{key}"><h2>{escape(heading)}</h2>' + "".join(parts)
            + "</section>")


def cell(text: Any, value: Any = None, css: str = "") -> str:
    """A <td>: `text` shown (escaped), `value` the raw number kept in data-value."""
    attrs = "" if value is None else f' data-value="{escape(str(value))}"'
    attrs += f' class="{css}"' if css else ""
    return f"<td{attrs}>{escape(str(text))}</td>"


def table(headers: Sequence[str], rows: Sequence[tuple], key: str, sortable: bool = False) -> str:
    """rows: (data-row name, already rendered cells[, row class]); `key` names the table for
    the tests."""
    head = "".join(f'<th scope="col">{escape(h)}</th>' for h in headers)
    body = "".join(f'<tr data-row="{escape(row[0])}"'
                   + (f' class="{row[2]}"' if len(row) > 2 and row[2] else "")
                   + f'>{"".join(row[1])}</tr>' for row in rows)
    css = ' class="sortable"' if sortable else ""
    return (f'<div class="scroll"><table data-table="{key}"{css}><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def para(text: str, css: str = "") -> str:
    return f'<p{f" class={chr(34)}{css}{chr(34)}" if css else ""}>{escape(text)}</p>'


def number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
