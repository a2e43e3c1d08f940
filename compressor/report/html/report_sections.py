"""report.html's sections past the headline ones: fine-tuning curves,
the int8 fallback search, channel pruning, the plan, notes and the run's timings / versions.
Each returns "" when the report has nothing for it."""
from __future__ import annotations

import math
from html import escape
from typing import Any

from compressor.render.html import cell, number, para, section, table
from compressor.render.charts import (SERIES_COLOURS, BarRow, Segment, Series, bar_chart,
                                    legend, line_chart)
from compressor.report.html.tensors import tensors_section
from compressor.render.sizes import human_size
from compressor.report.text import fallback_summary

__all__ = ["channel_section", "fallback_section", "history_section",
           "notes_section", "plan_section", "run_section", "tensors_section"]


def history_section(report: dict[str, Any]) -> str:
    """Per training step: loss, val metric and learning rate per epoch, the kept epoch ringed."""
    steps = [s for s in report.get("history") or () if s.get("epochs")]
    if not steps:
        return ""
    parts = []
    for i, step in enumerate(steps):
        epochs = step["epochs"]
        kept = [step["best_epoch"]] if step.get("best_epoch") is not None else [epochs[-1]["epoch"]]
        metric = step.get("metric") or "val metric"
        charts = [line_chart([Series("loss", [(e["epoch"], e["loss"]) for e in epochs],
                                     SERIES_COLOURS[0], kept)],
                             label=f"{step['step']}: loss", x_label="epoch", y_label="loss")]
        scored = [(e["epoch"], e["val_metric"]) for e in epochs if e.get("val_metric") is not None]
        if scored:
            charts.append(line_chart([Series(metric, scored, SERIES_COLOURS[1], kept)],
                                     label=f"{step['step']}: {metric}", x_label="epoch",
                                     y_label=f"val {metric}"))
        rates = [(e["epoch"], math.log10(e["lr"])) for e in epochs if e.get("lr")]
        if rates:
            charts.append(line_chart([Series("lr", rates, SERIES_COLOURS[2], kept)],
                                     label=f"{step['step']}: learning rate", x_label="epoch",
                                     y_label="lr (log)", fmt=lambda v: f"{10 ** v:.1e}"))
        cells = [(str(e["epoch"]), [
            cell(e["epoch"], e["epoch"]), cell(f"{e['loss']:.4f}", e["loss"]),
            cell(number(e.get("lr"), ".2e"), e.get("lr")),
            cell(number(e.get("val_metric"), ".4f")
                 + (" (kept)" if e["epoch"] in kept else ""), e.get("val_metric"))])
            for e in epochs]
        note = (f"kept epoch {kept[0]}" + ("" if step.get("best_epoch") is not None
                                           else " (the last)")
                + ("; stopped early" if step.get("stopped_early") else ""))
        parts += [f'<h3 data-step="{i}">{escape(step["step"])}: {escape(note)}</h3>',
                  '<div class="grid">' + "".join(charts) + "</div>",
                  table(("epoch", "loss", "lr", metric), cells, f"history-{i}")]
    return section("history", "Fine-tuning", *parts,
                   para("The ringed point is the epoch whose weights were kept.", "note"))


def fallback_section(report: dict[str, Any]) -> str:
    """The int8 fallback search: layers by sensitivity, those kept float, what each cost."""
    found = report.get("fallback")
    if not found:
        return ""
    metric = report["baseline"]["metric"]
    floats = set(found["float_layers"])
    costs = {row["layer"]: row["size_cost_bytes"] for row in found.get("float_layer_costs", ())}
    rows = [BarRow(r["layer"], [Segment(max(r["sensitivity"], 0.0),
                                        "#f58518" if r["layer"] in floats else "#4c78a8",
                                        f"{r['sensitivity']:+.4f} {metric} gained float")],
                   f"{r['sensitivity']:+.4f}" + (" kept float" if r["layer"] in floats else ""))
            for r in found["ranking"]]
    cells = [(r["layer"], [cell(r["layer"]), cell(f"{r['sensitivity']:+.4f}", r["sensitivity"]),
                           cell(f"{r['size_cost_bytes']:+,} B", r["size_cost_bytes"]),
                           cell("yes" if r["layer"] in floats else "no",
                                str(r["layer"] in floats).lower()),
                           cell(f"{costs[r['layer']]:+,} B" if r["layer"] in costs else "-",
                                costs.get(r["layer"]))]) for r in found["ranking"]]
    summary = fallback_summary(found, metric)
    parts = [para(summary)]
    if rows:
        parts += [bar_chart(rows, label=f"per-layer sensitivity ({metric} gained float)",
                            fmt=lambda v: f"{v:.4f}"),
                  legend([("#f58518", "kept float"), ("#4c78a8", "int8")]),
                  table(("layer", f"sensitivity ({metric})", "size cost alone", "kept float",
                         "size cost in the artifact"), cells, "fallback", sortable=True)]
    return section("fallback", "int8 fallback", *parts)


def channel_section(report: dict[str, Any]) -> str:
    """Structured pruning: params and MACs before / after, heads removed, layers left whole."""
    channels = report.get("channel_pruning")
    if not channels:
        return ""
    before, after = channels["model_before"], channels["model_after"]
    parts = [para(f"Removed {channels['ratio']:.0%} of the channels of "
                  f"{channels['groups_pruned']} channel group(s)"
                  + (f" (target MACs {channels['target_macs']:.0%})"
                     if channels.get("target_macs") else "") + ".")]
    for key, label in (("params", "params"), ("macs", "MACs per sample")):
        parts.append(bar_chart(
            [BarRow("before", [Segment(before[key], "#9e9e9e", f"{before[key]:,}")],
                    f"{before[key]:,}"),
             BarRow("after", [Segment(after[key], "#4c78a8", f"{after[key]:,}")],
                    f"{after[key]:,} ({after[key] / max(before[key], 1):.2f}x)")],
            label=f"{label} before and after channel pruning"))
    cells = [(k, [cell(k), cell(f"{before[k]:,}", before[k]), cell(f"{after[k]:,}", after[k]),
                  cell(f"{after[k] / max(before[k], 1):.3f}x")]) for k in ("params", "macs")]
    parts.append(table(("count", "before", "after", "ratio"), cells, "channels"))
    widths = channels.get("widths") or []
    if widths:
        parts.append(table(("layer", "channels before", "channels after"),
                           [(w["layer"], [cell(w["layer"]), cell(w["before"], w["before"]),
                                          cell(w["after"], w["after"])]) for w in widths],
                           "widths"))
    heads = channels.get("attention_heads") or []
    if heads:
        parts.append(table(("attention layer", "heads before", "heads after"),
                           [(h["layer"], [cell(h["layer"]), cell(h["before"], h["before"]),
                                          cell(h["after"], h["after"])]) for h in heads], "heads"))
    if channels.get("kept_whole"):
        parts.append("<h3>Left whole</h3><ul>" + "".join(
            f"<li><code>{escape(', '.join(e['layers']))}</code>: {escape(e['reason'])}</li>"
            for e in channels["kept_whole"]) + "</ul>")
    return section("channels", "Channel pruning", *parts)


def plan_section(report: dict[str, Any]) -> str:
    """`compress plan`'s output (its JSON keys) when the run recorded one."""
    plan = report.get("plan")
    if not plan or not plan.get("plans"):
        return ""
    cells = [(p["recipe"], [
        cell(p["recipe"]), cell(human_size(p["weights_bytes"]), p["weights_bytes"]),
        cell(human_size(p["kv_cache_bytes"]), p["kv_cache_bytes"]),
        cell(human_size(p["total_bytes"]), p["total_bytes"]),
        cell("yes" if p["fits"] else "NO", str(bool(p["fits"])).lower(),
             "yes" if p["fits"] else "no"),
        cell(number(p.get("decode_tokens_per_s_bound"), ".1f"), p.get("decode_tokens_per_s_bound")),
        cell(p.get("max_context", "-"), p.get("max_context"))]) for p in plan["plans"]]
    usable = (plan.get("device") or {}).get("usable_bytes")
    return section("plan", "Plan", para(
        f"Target {plan.get('target')}, context {plan.get('context')}, batch {plan.get('batch')}"
        + (f", {human_size(usable)} usable" if usable else "")
        + (f"; recommended: {plan['recommended']}" if plan.get("recommended") else "") + "."),
        table(("recipe", "weights", "KV cache", "total", "fits", "decode tok/s bound",
               "max context"), cells, "plan"))


def notes_section(report: dict[str, Any]) -> str:
    """The int8 mode chosen, formats not produced, load notes."""
    items = []
    if report.get("quantize"):
        items.append(f"int8 mode: {report['quantize']['mode']} ({report['quantize']['reason']})")
    for failed in report.get("failed_formats") or ():
        items.append(f"{failed['format']} not produced: {failed['error']}")
    items += [str(note) for note in report.get("notes") or ()]
    if report.get("teacher"):
        items.append(f"teacher: {report['teacher']}")
    if not items:
        return ""
    return section("notes", "Notes", "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items)
                   + "</ul>")


def run_section(report: dict[str, Any]) -> str:
    timings = report.get("timings_s") or {}
    rows = [BarRow(k, [Segment(v, SERIES_COLOURS[0], f"{v:.2f} s")], f"{v:.1f} s")
            for k, v in timings.items()]
    versions = ", ".join(f"{k} {v}" for k, v in (report.get("versions") or {}).items())
    return section("run", "Run", bar_chart(rows, label="seconds per step") if rows else "",
                   para(f"Versions: {versions}", "note") if versions else "")
