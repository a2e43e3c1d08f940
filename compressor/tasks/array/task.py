"""The array task: classifiers, regressors and encoders fed arrays (images, token ids, features),
scored by accuracy, fidelity, mse or a custom metric on the val split."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import compressor.tasks.array.report as report
from compressor.tasks.base import Opened, OpenRequest, register_task


@register_task
class ArrayTask:
    name: ClassVar[str] = "array"
    sweep_columns: ClassVar[tuple[str, ...]] = ()
    metric_lower_is_better: ClassVar[bool] = False   # mse drops into `drop` the same way

    def before_load(self, request: OpenRequest) -> dict[str, Any] | None:
        """A language-model recipe, or --devices (a language model's split), is refused here
        (exit 2), before the model is loaded."""
        from compressor.errors import UsageError
        from compressor.tasks.array.recipe_fit import check_recipe_fits

        if request.devices is not None:
            raise UsageError(f"--devices {request.devices}: only a language model's ONNX artifact "
                             "is split into pipeline stages; this model is not a language model, "
                             "so drop --devices")
        check_recipe_fits(request.recipe, request.model_ref)
        return None

    def open(self, request: OpenRequest, backend: Any, model: Any) -> Opened:
        from compressor.tasks.array.session import open_array

        return open_array(request, backend, model)

    def evaluate(self, session: Any, state: Any, path: Path) -> dict[str, Any]:
        from compressor.tasks.array.evaluate import evaluate_artifact

        ctx = session.ctx
        return evaluate_artifact(path, ctx.data, ctx.reference_outputs, ctx.baseline_value,
                                 session.validation, metric=ctx.metric, workdir=ctx.workdir,
                                 latency=session.measure_latency, threads=session.threads,
                                 weight_bits=state.scheme.weight_bits)

    def budget_bytes(self, profile: Any) -> int:
        return profile.budget_bytes   # a vision / encoder model shares the board

    def add_report_keys(self, report_json: dict[str, Any], session: Any) -> None:
        from compressor.tasks.array.sanity import chance_level

        ctx = session.ctx
        report_json["baseline"]["chance_level"] = chance_level(
            ctx.metric or session.validation.metric, ctx.baseline_value,
            ctx.reference_outputs) is not None

    def markdown_lines(self, report_json: dict[str, Any]) -> list[str]:
        return []   # the common artifact table is this task's table

    def summary(self, report_json: dict[str, Any]) -> tuple[str, tuple[str, ...], list[list[str]]]:
        return report.summary(report_json)

    def metric_section(self, report_json: dict[str, Any]) -> str:
        return report.metric_section(report_json)
