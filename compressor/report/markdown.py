"""report.md: the verdict, the artifact table (the task's own table before it), and the
sections of what the run did (fallback search, channel pruning, fine-tuning, timings)."""
from __future__ import annotations

from typing import Any

from compressor.render.rows import weight_share_text
from compressor.render.sizes import human_size, short_count
from compressor.report.text import fallback_summary
from compressor.tasks import task_of_report


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
    task_lines = task_of_report(report).markdown_lines(report)
    if task_lines:   # the task's own table (a language model's), then the same sections below
        lines = lines[:-3] + task_lines + [""] + lines[-3:]
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
