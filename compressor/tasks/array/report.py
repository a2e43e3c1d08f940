"""What an array model's report shows beyond the common tables: its row on the terminal and its
metric against the gate in report.html."""
from __future__ import annotations

from typing import Any

from compressor.config.gate import bound_from_report
from compressor.render.charts import BarRow, Marker, Segment, bar_chart
from compressor.render.html import cell, para, section, table
from compressor.render.sizes import human_size
from compressor.render.rows import weight_share_text

SUMMARY_COLUMNS = ("artifact", "size", "gzip", "{metric}", "drop", "sparsity", "weights", "p50 ms",
                   "est. memory", "fits")


def summary(report: dict[str, Any]) -> tuple[str, tuple[str, ...], list[list[str]]]:
    base = report["baseline"]
    metric = base["metric"]
    title = (f"{report['recipe']['name']}: {report['framework']} model, baseline "
             f"{metric} {base['value']:.4f}")
    rows = []
    for art in report["artifacts"]:
        latency = "-" if art["latency_ms_p50"] is None else f"{art['latency_ms_p50']:.3f}"
        rows.append([art["path"], human_size(art["size_bytes"]), human_size(art["gzip_bytes"]),
                     f"{art['metric_value']:.4f}", f"{art['drop']:+.4f}", f"{art['sparsity']:.1%}",
                     weight_share_text(art, top_only=True), latency,
                     human_size(art["est_peak_memory_bytes"]),
                     "yes" if art["fits_target"] else "NO"])
    return title, tuple(c.format(metric=metric) for c in SUMMARY_COLUMNS), rows


def metric_section(report: dict[str, Any]) -> str:
    arts = report["artifacts"]
    if not arts:
        return ""
    base, gate = report["baseline"], report["gate"]
    metric = base["metric"]
    rows, cells = [], []
    bound = bound_from_report(gate, metric)
    limit = gate.get("min_fidelity")
    for art in arts:
        drop = art["drop"]
        ok = bound.passes(art["metric_value"], drop)
        rows.append(BarRow(art["path"], [Segment(max(drop, 0.0), "#e45756" if not ok else
                                                 "#4c78a8", f"drop {drop:+.4f}")],
                           f"drop {drop:+.4f}" + ("" if drop > 0 else " (none)")))
        cells.append((art["path"], [
            cell(art["path"]), cell(f"{art['metric_value']:.4f}", art["metric_value"]),
            cell(f"{drop:+.4f}", drop),
            cell("yes" if ok else "NO", str(ok).lower(), "yes" if ok else "no")]))
    parts = []
    if limit is None:
        parts.append(bar_chart(rows, [Marker(gate["max_drop"], f"gate {gate['max_drop']}",
                                             "#c62828")],
                               label=f"{metric} drop per artifact against the gate",
                               fmt=lambda v: f"{v:.4f}"))
    headers = ("artifact", metric, "drop vs baseline", "within the gate")
    parts.append(table(headers, cells, "metric"))
    parts.append(para(f"Baseline {metric} {base['value']:.4f}; gate: {bound.text()}. "
                      "Each artifact is scored in its own runtime on the held-out data.", "note"))
    return section("metric", f"{metric.capitalize()} against the gate", *parts)
