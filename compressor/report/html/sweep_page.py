"""sweep.html (`compress sweep`): the Pareto plot with the front highlighted and every point
labelled with its recipe, a sortable table of the sweep's rows (front rows marked), and a link
to each recipe's report.html.

The plot is compress sweep's own matplotlib figure (sweep.plot_pareto, the one pareto.png
shows), written as SVG with its text kept as text and every URL stripped (the XML prolog, the
DOCTYPE, the RDF metadata, the xmlns attributes an HTML page does not need).
"""
from __future__ import annotations

import io
import math
import re
from html import escape
from pathlib import Path
from typing import Any

from compressor.render.html import cell, page, para, section, table
from compressor.render.sizes import human_size



def _yes_no(value: Any) -> str:
    return "yes" if value else "NO"


SVG_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
SVG_METADATA = re.compile(r"<metadata>.*?</metadata>", re.S)
SVG_NAMESPACES = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
SVG_SIZE = re.compile(r'(<svg[^>]*?)\s+width="[^"]*"\s+height="[^"]*"')
# (column, header, text) in table order; rows lacking a column leave it out
COLUMNS = (("format", "format", str), ("size_bytes", "size", human_size),
           ("gzip_bytes", "gzip", human_size), ("metric_value", "metric", "{:.4f}".format),
           ("drop", "drop", "{:+.4f}".format), ("perplexity", "perplexity", "{:.3f}".format),
           ("decode_tokens_per_s", "decode tok/s", "{:.1f}".format),
           ("kv_cache_bytes", "KV cache", human_size),
           ("latency_ms_p50", "p50 ms", "{:.4f}".format), ("fits_target", "fits", _yes_no),
           ("passed", "passed", _yes_no))


def render_sweep(frame, out_dir: Path, x: str = "size_bytes", y: str = "metric_value") -> str:
    """The page for a sweep's DataFrame; links point at out_dir/<recipe>/report.html."""
    from compressor.report.pareto import lower_is_better, pareto_front, plot_pareto

    ok = frame.dropna(subset=[x, y])
    front = set(pareto_front(ok, x, y).index) if len(ok) else set()
    better = "lower" if len(ok) and lower_is_better(ok, y) else "higher"
    parts = []
    if len(ok):
        parts.append(section("pareto", "Pareto front", figure_svg(_marked(plot_pareto(frame, x, y),
                                                                          ok.loc[sorted(front)], x, y)),
                             para(f"{y} ({better} is better) against {x}; the red steps join "
                                  "the rows no other row beats on both.", "note")))
    parts.append(section("runs", "Runs", rows_table(frame, out_dir, front)))
    failed = frame[frame["error"].notna()] if "error" in frame else frame.iloc[0:0]
    if len(failed):
        parts.append(section("errors", "Recipes that failed", "<ul>" + "".join(
            f"<li><b>{escape(str(r['recipe']))}</b>: {escape(str(r['error']))}</li>"
            for _, r in failed.iterrows()) + "</ul>"))
    head = (f"<header><h1>compress sweep: {len(set(frame['recipe']))} recipe(s)</h1>"
            f"<p>{len(front)} of {len(ok)} artifact(s) on the front; click a column to sort, "
            "a recipe to open its report.</p></header>")
    return page("compress sweep", [head, *parts], sortable=True)


def rows_table(frame, out_dir: Path, front: set) -> str:
    columns = [c for c in COLUMNS if c[0] in frame and frame[c[0]].notna().any()]
    rows = []
    for index, row in frame.iterrows():
        recipe = str(row["recipe"])
        report = Path(out_dir) / recipe / "report.html"
        name = (f'<a href="{escape(recipe)}/report.html">{escape(recipe)}</a>'
                if report.is_file() else escape(recipe))
        cells = [f'<td class="text">{name}</td>']
        for key, _, text in columns:
            value = _plain(row[key])
            cells.append(cell("-" if value is None else text(value), value))
        on_front = index in front
        cells.append(cell("yes" if on_front else "", str(on_front).lower()))
        rows.append((f"{recipe}:{_plain(row.get('format')) or ''}", cells,
                     "front" if on_front else ""))
    return table(["recipe", *(c[1] for c in columns), "on front"], rows, "sweep", sortable=True)


def _marked(fig, front, x: str, y: str):
    """The front's points drawn again, larger and red, over plot_pareto's figure."""
    ax = fig.axes[0]
    ax.scatter(front[x], front[y], s=90, facecolors="none", edgecolors="tab:red", linewidths=2,
               zorder=4, label="on the front")
    ax.legend(loc=ax.get_legend()._loc if ax.get_legend() else "best")
    return fig


def figure_svg(fig) -> str:
    """A matplotlib Figure as inline SVG markup without a single URL in it."""
    import matplotlib
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "compressor"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    svg = SVG_NAMESPACES.sub("", SVG_METADATA.sub("", SVG_PROLOG.sub("", buffer.getvalue(), 1)))
    return SVG_SIZE.sub(r'\1 class="chart" role="img" aria-label="Pareto plot"', svg, 1)


def _plain(value: Any) -> Any:
    """numpy scalars -> Python; NaN / None -> None."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
