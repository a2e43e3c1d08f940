"""The causal language-model task: token windows of text, perplexity against the original,
next-token and greedy agreement, and what generating costs on the device."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from compressor.tasks.base import Opened, OpenRequest, register_task
import compressor.tasks.lm.report as report

# artifact keys a sweep frame adds for a language model (report.json per LM artifact)
SWEEP_COLUMNS = ("perplexity", "perplexity_increase", "top1_agreement", "greedy_agreement",
                 "prefill_ms", "decode_tokens_per_s", "peak_rss_bytes", "kv_cache_bytes", "context")


@register_task
class LmTask:
    name: ClassVar[str] = "lm"
    sweep_columns: ClassVar[tuple[str, ...]] = SWEEP_COLUMNS
    metric_lower_is_better: ClassVar[bool] = True    # metric_value is a perplexity

    def before_load(self, request: OpenRequest) -> dict[str, Any] | None:
        """A format no route writes for this model, --devices without an ONNX artifact to
        split, then a recipe the device cannot hold: refused from config.json and the weights'
        headers, before any weight is read."""
        from compressor.backends.llm.routes import config_of, writable_formats
        from compressor.tasks.lm.session import check_plan_fits
        from compressor.tasks.lm.split import check_split_asked

        config = config_of(request.model_ref)
        formats = request.formats
        if config is not None:
            formats, _ = writable_formats(config, request.formats, request.formats_asked)
        check_split_asked(request.devices, formats)
        return check_plan_fits(request.model_ref, request.recipe, request.target,
                               request.context, request.force_plan, request.devices)

    def open(self, request: OpenRequest, backend: Any, model: Any) -> Opened:
        from compressor.tasks.lm.session import open_lm

        return open_lm(request, backend, model)

    def evaluate(self, session: Any, state: Any, path: Path) -> dict[str, Any]:
        from compressor.tasks.lm.evaluate import evaluate_lm_artifact

        ctx = session.ctx
        row = evaluate_lm_artifact(path, ctx.data, ctx.reference_outputs, ctx.baseline_value,
                                   session.validation, latency=session.measure_latency,
                                   threads=session.threads, weight_bits=state.scheme.weight_bits)
        from compressor.tasks.lm.split import is_split_source, split_in_run

        if session.devices and is_split_source(path):   # --devices K: split/ beside model-onnx/
            row["split"] = split_in_run(path, session.devices, session.threads,
                                        session.measure_latency, ctx.progress)
        return row

    def budget_bytes(self, profile: Any) -> int:
        return profile.llm_budget_bytes   # a language model is the board's one job (llm_share)

    def add_report_keys(self, report_json: dict[str, Any], session: Any) -> None:
        """baseline.perplexity, the gate's allowed increase, the context the KV caches are sized
        to, and the peak RSS this run needed (this process and its children summed, sampled)."""
        from compressor.config.gate import allowed_increase
        from compressor.core.memory import peak_rss_bytes

        report_json["baseline"]["perplexity"] = session.ctx.baseline_value
        report_json["baseline"]["fp16_bytes"] = 2 * session.info.params   # the ratio's denominator
        report_json["gate"]["max_increase"] = allowed_increase(session.validation)
        report_json["context"] = session.ctx.context
        report_json["compress_peak_rss_bytes"] = peak_rss_bytes()

    def markdown_lines(self, report_json: dict[str, Any]) -> list[str]:
        return report.markdown_lines(report_json)

    def summary(self, report_json: dict[str, Any]) -> tuple[str, tuple[str, ...], list[list[str]]]:
        return (report.lm_title(report_json), report.COLUMNS,
                [report.lm_row(art, report_json) for art in report_json["artifacts"]])

    def metric_section(self, report_json: dict[str, Any]) -> str:
        return report.llm_section(report_json)
