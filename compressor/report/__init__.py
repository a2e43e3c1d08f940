"""report.json (stable keys, see DESIGN.md) and a readable report.md."""
from __future__ import annotations

import json
import platform
from importlib import metadata
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.tasks.lm.report import human_size, is_lm_report, markdown_lines
from compressor.report.text import fallback_summary, short_count
from compressor.tasks.array.sanity import chance_level
from compressor.tasks.array.metrics import weight_share_text

if TYPE_CHECKING:
    from compressor.run.session import Session

# Packages whose versions make a result reproducible; missing ones are simply left out.
VERSIONED_PACKAGES = ("compressor", "numpy", "tensorflow", "tf-keras", "tensorflow-model-optimization",
                      "tf2onnx", "torch", "torchao", "litert-torch", "onnx", "onnxruntime",
                      "ai-edge-litert", "tflite-runtime")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def build_report(session: Session, rows: list[dict[str, Any]], verdict: dict[str, Any],
                 artifacts: Mapping[str, Path]) -> dict:
    """report.json's content for validated artifact `rows` and the gate / budget `verdict`;
    the run record (session.record) gives timings, histories, sections and notes."""
    recipe = session.recipe
    record = session.record
    validation = session.validation
    report = {
        "recipe": {"name": recipe.name, "sha256": recipe.sha256()},
        "seed": session.ctx.seed,
        "target": session.target,
        "budget_bytes": verdict["budget_bytes"],
        "framework": session.backend.name,
        "model": session.model_ref,
        "data": session.ctx.data.name,
        "baseline": {"metric": session.metric_name, "value": session.ctx.baseline_value,
                     "size_bytes": session.info.size_bytes, "params": session.info.params,
                     "chance_level": chance_level(session.ctx.metric or validation.metric,
                                                  session.ctx.baseline_value,
                                                  session.ctx.reference_outputs) is not None},
        "teacher": session.teacher_entry,
        "artifacts": rows,
        # batch-1 latency is timed in a fresh process per artifact with this many threads
        "latency_threads": next((row.get("latency_threads") for row in rows
                                 if row.get("latency_threads")), None),
        "gate": {"max_drop": validation.max_drop, "min_fidelity": validation.min_fidelity,
                 "passed": verdict["gate_passed"]},
        "passed": verdict["exit_code"] == 0,
        "exit_code": verdict["exit_code"],
        "failures": verdict["failures"],
        "timings_s": {k: round(v, 3) for k, v in record.timings.items()},
        # each training step's epochs: loss, lr, val metric, the kept (best) epoch
        "history": [entry.as_dict() for entry in record.histories],
        "versions": package_versions(),
    }
    if validation.metric == "perplexity":
        _add_language_model_keys(report, session, validation)
    report.update(record.notes)   # user_loop (cz.prepare runs), sweep (what a sweep resumes by)
    report["failed_formats"] = record.failed_formats
    for section in record.sections:
        report[section.key] = section.report(artifacts)
    return report


def _add_language_model_keys(report: dict[str, Any], session: Session, validation: Any) -> None:
    """baseline.perplexity, the gate's allowed increase, the context the KV caches are sized
    to, and the peak RSS this run needed (this process and its children summed, sampled)."""
    from compressor.config.gate import allowed_increase
    from compressor.core.memory import peak_rss_bytes

    report["baseline"]["perplexity"] = session.ctx.baseline_value
    report["baseline"]["fp16_bytes"] = 2 * session.info.params   # the ratio's denominator
    report["gate"]["max_increase"] = allowed_increase(validation)
    report["context"] = session.ctx.context
    report["compress_peak_rss_bytes"] = peak_rss_bytes()


def write_report(report: dict[str, Any], folder: Path) -> None:
    """report.json, report.md and report.html into `folder` (the caller's staging folder, which
    is published whole; report.html reads the artifacts beside it for its tensor chart)."""
    from compressor.report.html.report_page import render_html

    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(render_markdown(report))
    (folder / "report.html").write_text(render_html(report, folder))


def render_markdown(report: dict[str, Any]) -> str:
    base = report["baseline"]
    gate = report["gate"]
    metric = base["metric"]
    lines = [
        f"# compress report: {report['recipe']['name']}",
        "",
        f"- Result: **{'PASSED' if report['passed'] else 'FAILED'}**"
        + ("" if report["passed"] else f" ({'; '.join(report['failures'])})"),
        f"- Baseline ({report['framework']} model): {metric} {base['value']:.4f}, "
        f"{base['params']:,} params, {human_size(base['size_bytes'])} fp32 weights"
        + (" - **at chance level: the gate compares against a model that guesses**"
           if base.get("chance_level") else ""),
        f"- Gate: {_gate_text(gate, metric)}; target device: {report['target'] or 'none'}"
        + (f" (budget {human_size(report['budget_bytes'])})" if report.get("budget_bytes") else ""),
        f"- Seed {report['seed']}; recipe sha256 {report['recipe']['sha256'][:12]}",
        "",
        f"| artifact | size | gzip | {metric} | drop | sparsity | params | MACs | weight dtypes "
        "| p50 ms | est. memory | fits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    if is_lm_report(report):   # the language-model table, then the same sections below
        lines = lines[:-3] + markdown_lines(report) + [""] + lines[-3:]
    for art in report["artifacts"]:
        dtypes = weight_share_text(art)   # an integer scheme: its share as the gate reads it
        latency = "-" if art["latency_ms_p50"] is None else f"{art['latency_ms_p50']:.3f}"
        lines.append(
            f"| {art['path']} | {human_size(art['size_bytes'])} | {human_size(art['gzip_bytes'])} "
            f"| {art['metric_value']:.4f} | {art['drop']:+.4f} | {art['sparsity']:.1%} "
            f"| {short_count(art.get('params'))} | {short_count(art.get('macs'))} | {dtypes} "
            f"| {latency} | {human_size(art['est_peak_memory_bytes'])} | {'yes' if art['fits_target'] else 'NO'} |")
    quantize = report.get("quantize")
    if quantize:
        lines += ["", f"int8 mode: **{quantize['mode']}** ({quantize['reason']})"]
    for failed in report.get("failed_formats") or ():
        lines += ["", f"**{failed['format']} not produced**: {failed['error']}"
                  + (f" (logs in {failed['logs']})" if failed.get("logs") else "")]
    lines += _fallback_lines(report.get("fallback"), metric)
    lines += _channel_lines(report.get("channel_pruning"))
    lines += _history_lines(report.get("history"))
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in report["timings_s"].items())
    lines += ["", f"Timings: {timings}", "",
              "Sizes, dtypes and sparsity are read back from the artifact files; metrics and "
              "latency are measured by running them in their runtimes "
              f"({', '.join(sorted({a['runtime'] for a in report['artifacts']}))})"
              + (f"; p50 is batch-1 latency with {report['latency_threads']} thread(s), timed "
                 "in a fresh process that loads only the runtime"
                 if report.get("latency_threads") else "") + ".", ""]
    return "\n".join(lines)


def _fallback_lines(fallback: dict[str, Any] | None, metric: str) -> list[str]:
    """The int8 fallback search: layers by sensitivity, and what each float layer costs."""
    if fallback is None:
        return []
    floats = fallback["float_layers"]
    costs = {row["layer"]: row["size_cost_bytes"] for row in fallback["float_layer_costs"]}
    summary = fallback_summary(fallback, metric)
    lines = ["", "## int8 fallback", "", summary, ""]
    if not fallback["ranking"]:
        return lines
    header = (f"| layer | sensitivity ({metric} gained float) | size cost alone | kept float "
              "| size cost in the artifact |")
    lines += [header, "|---|---:|---:|---|---:|"]
    for row in fallback["ranking"]:
        layer = row["layer"]
        cost = f"{costs[layer]:+,} B" if layer in costs else "-"
        lines.append(f"| {layer} | {row['sensitivity']:+.4f} | {row['size_cost_bytes']:+,} B | "
                     f"{'yes' if layer in floats else 'no'} | {cost} |")
    return lines


def _channel_lines(channels: dict[str, Any] | None) -> list[str]:
    """Structured pruning: the framework model's params / MACs before and after, the attention
    heads removed, and the layers left whole (the artifacts' own counts are in the table above)."""
    if channels is None:
        return []
    before, after = channels["model_before"], channels["model_after"]
    lines = ["", "## Channel pruning", "",
             f"Removed {channels['ratio']:.0%} of the channels of {channels['groups_pruned']} "
             f"channel group(s); the model went from {before['params']:,} to "
             f"{after['params']:,} params ({after['params'] / max(before['params'], 1):.2f}x) and "
             f"{before['macs']:,} to {after['macs']:,} MACs "
             f"({after['macs'] / max(before['macs'], 1):.2f}x) per sample."]
    heads = channels.get("attention_heads") or []
    if heads:
        lines += ["", "Attention heads removed (whole heads: query, key, value and output "
                  "projection slices):", ""]
        lines += [f"- {entry['layer']}: {entry['before']} -> {entry['after']} heads"
                  for entry in heads]
    if channels["kept_whole"]:
        lines += ["", "Left whole:", ""]
        lines += [f"- {', '.join(entry['layers'])}: {entry['reason']}"
                  for entry in channels["kept_whole"]]
    return lines


def _history_lines(history: list[dict[str, Any]] | None) -> list[str]:
    """Each training step's epochs; the kept one in bold (keep_best), an early stop noted."""
    lines = ["", "## Fine-tuning"] if history else []
    for step in history or ():
        metric = step["metric"] or "val metric"
        kept = (f"kept epoch {step['best_epoch']}" if step["best_epoch"] is not None
                else "kept the last epoch")
        lines += ["", f"{step['step']}: {kept}"
                  + ("; stopped early" if step["stopped_early"] else ""), "",
                  f"| epoch | loss | lr | {metric} |", "|---:|---:|---:|---:|"]
        for epoch in step["epochs"]:
            value = "-" if epoch["val_metric"] is None else f"{epoch['val_metric']:.4f}"
            if epoch["epoch"] == step["best_epoch"]:
                value = f"**{value}** (best)"
            lines.append(f"| {epoch['epoch']} | {epoch['loss']:.4f} | {epoch['lr']:.2e} "
                         f"| {value} |")
    return lines


def _gate_text(gate: dict[str, Any], metric: str) -> str:
    from compressor.config.gate import bound_from_report

    return bound_from_report(gate, metric).text()


