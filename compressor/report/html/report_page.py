"""report.html: what a run did, for people to look at (report.json holds the same numbers).

Sections appear only where the run has the data: the verdict first, then sizes (a stacked
dtype bar per artifact against the original), the metric against the gate, latency, the
largest tensors, fine-tuning curves, the fallback search, channel pruning, language-model
metrics, the plan, notes and timings (compressor/report/html/report_sections.py draws the later ones).
"""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from compressor.config.gate import bound_from_report
from compressor.render.html import cell, number, page, para, section, table
from compressor.render.charts import BarRow, Segment, bar_chart, dtype_colour, legend
from compressor.runtimes.weights import ITEMSIZE
from compressor.report.html.report_sections import (channel_section, fallback_section,
                                                    history_section, notes_section, plan_section,
                                                    run_section, tensors_section)
from compressor.tasks import task_of_report
from compressor.render.sizes import human_size, short_count

def render_html(report: dict[str, Any], folder: Path | None = None) -> str:
    """The page for `report` (report.json's dict); `folder` holds its artifacts, read for the
    largest tensors when report.json does not list them (absent files: that chart is left out)."""
    name = report["recipe"]["name"]
    body = [f"<header><h1>compress report: {escape(name)}</h1>{verdict(report)}"
            f"{facts(report)}</header>",
            size_section(report), task_of_report(report).metric_section(report),
            latency_section(report), tensors_section(report, folder), history_section(report),
            fallback_section(report), channel_section(report), plan_section(report),
            notes_section(report), run_section(report)]
    return page(f"compress report: {name}", body, sortable=True)


def verdict(report: dict[str, Any]) -> str:
    passed = report["passed"]
    state = "passed" if passed else "failed"
    code = report.get("exit_code")   # reports older than exit codes in report.json lack it
    failures = "".join(f"<li>{escape(text)}</li>" for text in report.get("failures") or ())
    return (f'<div id="verdict" class="verdict {state}" data-passed="{str(passed).lower()}"'
            + ("" if code is None else f' data-exit-code="{code}"') + ">"
            + ("PASSED" if passed else "FAILED")
            + ("" if code is None else f": exit code {code}")
            + (f"<ul>{failures}</ul>" if failures else "") + "</div>")


def facts(report: dict[str, Any]) -> str:
    base = report["baseline"]
    items = [("baseline", f"{base['metric']} {base['value']:.4f} ({report.get('framework')})"),
             ("params", f"{base['params']:,}"),
             ("original weights", human_size(base["size_bytes"]) + " fp32"),
             ("gate", gate_text(report)),
             ("target", (report.get("target") or "none")
              + (f" (budget {human_size(report['budget_bytes'])})"
                 if report.get("budget_bytes") else "")),
             ("model", str(report.get("model"))), ("data", str(report.get("data"))),
             ("seed", str(report["seed"])), ("recipe sha256", report["recipe"]["sha256"][:12])]
    if base.get("chance_level"):
        items.append(("warning", "the baseline is at chance level: the gate compares against "
                                 "a model that guesses"))
    return ('<ul class="facts">' + "".join(f"<li><b>{escape(k)}</b> {escape(v)}</li>"
                                           for k, v in items) + "</ul>")


def gate_text(report: dict[str, Any]) -> str:
    """report.md's words for the gate (compressor/config/gate.py: the bound that decides)."""
    return bound_from_report(report["gate"], report["baseline"]["metric"]).text()


def size_section(report: dict[str, Any]) -> str:
    arts = report["artifacts"]
    if not arts:
        return ""
    original = report["baseline"]["size_bytes"]
    rows = [BarRow("original (fp32)", [Segment(original, "#9e9e9e", human_size(original))],
                   human_size(original))]
    dtypes_seen: dict[str, None] = {}
    for art in arts:
        shares = byte_shares(art.get("weight_dtypes") or {})
        dtypes_seen.update(dict.fromkeys(shares))
        segments = [Segment(art["size_bytes"] * share, dtype_colour(dtype),
                            f"{dtype}: ~{human_size(int(art['size_bytes'] * share))} "
                            f"({share:.1%} of the weight bytes)")
                    for dtype, share in shares.items()] or [
            Segment(art["size_bytes"], dtype_colour(""), human_size(art["size_bytes"]))]
        note = (f"{human_size(art['size_bytes'])} ({art['size_bytes'] / max(original, 1):.2f}x)"
                f", {art['sparsity']:.0%} zeros")
        rows.append(BarRow(art["path"], segments, note, outline=art["gzip_bytes"]))
    chart = bar_chart(rows, label="artifact sizes against the original", fmt=human_size)
    keys = legend([(dtype_colour(d), d) for d in dtypes_seen]
                  + [("transparent", "dashed box: gzip -9 size")])
    cells = []
    for art in arts:
        dtypes = ", ".join(f"{k} {v:.1%}" for k, v in (art.get("weight_dtypes") or {}).items())
        fits = art.get("fits_target")
        cells.append((art["path"], [
            cell(art["path"]), cell(art.get("format") or "-"),
            cell(human_size(art["size_bytes"]), art["size_bytes"]),
            cell(human_size(art["gzip_bytes"]), art["gzip_bytes"]),
            cell(f"{art['size_bytes'] / max(original, 1):.3f}x",
                 round(art["size_bytes"] / max(original, 1), 6)),
            cell(f"{art['sparsity']:.1%}", art["sparsity"]),
            cell(dtypes or "-", css="text"),
            cell(short_count(art.get("params")), art.get("params")),
            cell(short_count(art.get("macs")), art.get("macs")),
            cell(human_size(art.get("est_peak_memory_bytes")), art.get("est_peak_memory_bytes")),
            cell("yes" if fits else "NO", str(bool(fits)).lower(), "yes" if fits else "no")]))
    headers = ("artifact", "format", "size", "gzip", "vs original", "sparsity",
               "weight dtypes (elements)", "params", "MACs", "est. memory", "fits target")
    return section("sizes", "Size and contents", chart, keys,
                   table(headers, cells, "artifacts", sortable=True),
                   para("Bar segments split the file by the share of weight bytes each stored "
                        "dtype holds (graph and metadata included pro rata); sparsity is the "
                        "zero fraction of the kernel weights.", "note"))


def byte_shares(weight_dtypes: dict[str, float]) -> dict[str, float]:
    """Element shares per dtype -> shares of the weight bytes (int4 counts half a byte)."""
    weighted = {k: v * ITEMSIZE.get(k, 4) for k, v in weight_dtypes.items() if v > 0}
    total = sum(weighted.values())
    return {k: v / total for k, v in sorted(weighted.items(), key=lambda kv: -kv[1])} if total else {}


def latency_section(report: dict[str, Any]) -> str:
    timed = [a for a in report["artifacts"] if a.get("latency_ms_p50") is not None]
    if not timed:
        return ""
    rows = [BarRow(a["path"], [Segment(a["latency_ms_p50"], "#4c78a8",
                                       f"p50 {a['latency_ms_p50']:.4f} ms")],
                   f"p50 {a['latency_ms_p50']:.3f} ms, p90 {number(a.get('latency_ms_p90'), '.3f')}",
                   outline=a.get("latency_ms_p90")) for a in timed]
    cells = [(a["path"], [cell(a["path"]), cell(f"{a['latency_ms_p50']:.4f}", a["latency_ms_p50"]),
                          cell(number(a.get("latency_ms_p90"), ".4f"), a.get("latency_ms_p90")),
                          cell(a.get("threads") or a.get("latency_threads") or "-",
                               a.get("threads") or a.get("latency_threads")),
                          cell(a.get("runtime") or "-", css="text")]) for a in timed]
    threads = report.get("latency_threads")
    return section("latency", "Latency (batch 1)",
                   bar_chart(rows, label="latency per artifact, ms", fmt=lambda v: f"{v:.3f} ms"),
                   legend([("#4c78a8", "p50"), ("transparent", "dashed box: p90")]),
                   table(("artifact", "p50 ms", "p90 ms", "threads", "runtime"), cells, "latency"),
                   para(f"Timed in a fresh process that loads only the runtime, with {threads} "
                        "thread(s)." if threads else "Timed in a fresh process.", "note"))
