"""Accuracy-aware int8: keep the most sensitive layers float until the accuracy gate passes.

Backend-agnostic. A candidate is built by the backend's own quantize + export with
`state.float_layers` set, and measured in its runtime on the val split, exactly as the
pipeline's gate will measure the final artifact. The search:

1. full int8; if it passes the gate, stop (1 evaluation);
2. sensitivity of each quantizable layer = metric gained when only that layer is left float
   (ties broken by fidelity to the original model's outputs) (N evaluations);
3. add layers in ranking order until the gate passes or `max_float_layers` is reached; the
   first step is the top layer's own measurement, so at most max_float_layers - 1 more.

At most 1 + N + max_float_layers - 1 evaluations of the val set.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from compressor.config.gate import gate_passes
from compressor.tasks.array.metrics import drop, metric_value
from compressor.errors import BackendUnavailableError, RecipeError, first_line
from compressor.export.int8 import export_checked

if TYPE_CHECKING:
    from compressor.backends.base import Backend
    from compressor.core.context import Context, ModelState
    from compressor.config.steps import QuantizeConfig

Quantize = Callable[["ModelState"], "ModelState"]   # a float state -> its int8 state


@dataclass(frozen=True)
class Trial:
    """One candidate artifact measured on the val split."""

    float_layers: tuple[str, ...]
    metric_value: float
    drop: float
    fidelity: float          # mean cosine vs the original model's outputs
    size_bytes: int
    passed: bool


@dataclass(frozen=True)
class RankedLayer:
    layer: str
    sensitivity: float       # metric gained by leaving only this layer float (+ = int8 hurts it)
    fidelity_gain: float     # tie-breaker: fidelity gained the same way
    size_cost_bytes: int     # artifact bytes added by leaving only this layer float


@dataclass(frozen=True)
class FallbackResult:
    """What the search measured: report.json's `fallback` section."""

    key = "fallback"
    format: str                          # the artifact format the search measured
    dtype: str                           # the float type asked for (fallback_dtype)
    full_int8: Trial
    ranking: tuple[RankedLayer, ...]
    steps: tuple[Trial, ...]             # the greedy additions, in order
    chosen: Trial
    evaluations: int

    @property
    def float_layers(self) -> tuple[str, ...]:
        return self.chosen.float_layers

    def report(self, artifacts: Mapping[str, Path]) -> dict[str, Any]:
        """report.json's `fallback`; float weight dtypes are read back from each artifact."""
        from compressor.runtimes import inspect_artifact

        float_dtypes = {}
        for fmt, path in artifacts.items():
            kernels = [w for w in inspect_artifact(path).weights if w.is_kernel]
            float_dtypes[fmt] = sorted({w.dtype for w in kernels if w.dtype.startswith("float")})
        costs = self.float_layer_costs()
        return {
            "format": self.format, "dtype": self.dtype,
            "ranking": [{"layer": r.layer, "sensitivity": round(r.sensitivity, 6),
                         "fidelity_gain": round(r.fidelity_gain, 6),
                         "size_cost_bytes": r.size_cost_bytes} for r in self.ranking],
            "float_layers": list(self.float_layers),
            "float_layer_costs": [{"layer": layer, "size_cost_bytes": cost}
                                  for layer, cost in costs],
            "float_weight_dtypes": float_dtypes,
            "full_int8": {"metric_value": self.full_int8.metric_value,
                          "drop": self.full_int8.drop, "size_bytes": self.full_int8.size_bytes},
            "chosen": {"metric_value": self.chosen.metric_value, "drop": self.chosen.drop,
                       "size_bytes": self.chosen.size_bytes, "passed": self.chosen.passed},
            "evaluations": self.evaluations,
        }

    def float_layer_costs(self) -> list[tuple[str, int]]:
        """Bytes each chosen float layer added, measured step by step on the searched format."""
        sizes = {trial.float_layers: trial.size_bytes for trial in self.steps}
        sizes[()] = self.full_int8.size_bytes
        layers = self.float_layers
        return [(layer, sizes.get(layers[:i + 1], 0) - sizes.get(layers[:i], 0))
                for i, layer in enumerate(layers)]


def search_float_layers(float_state: ModelState, config: QuantizeConfig, ctx: Context,
                        backend: Backend, quantize: Quantize) -> ModelState:
    """`quantize(float_state)`, with the fewest float layers (by sensitivity) that make the
    gate pass."""
    _require_gate(ctx)
    folder = Path(ctx.workdir) / "fallback"
    search = _Search(float_state, ctx, backend, quantize, folder)
    quantized = quantize(float_state)
    try:
        full = search.measure(quantized, ())
        layers = () if full.passed else tuple(backend.quantizable_layers(float_state))
        if not layers:   # nothing to search: int8 passes, or no layer could be left float
            ctx.record.add_section(FallbackResult(
                search.fmt, config.fallback_dtype, full, (), (), full, search.evaluations))
            return quantized
        ctx.progress.info(f"int8 fallback: full int8 drops {full.drop:.4f}; measuring "
                          f"{len(layers)} layers left float one at a time")
        singles = search.singles(layers)
        if not singles:   # no layer can be left float on its own: full int8 it is
            ctx.record.add_section(FallbackResult(
                search.fmt, config.fallback_dtype, full, (), (), full, search.evaluations))
            return quantized
        ranking = _ranked(full, singles)
        steps = search.greedy([r.layer for r in ranking], singles, config.max_float_layers)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # The first passing step; if none passes, the closest one (the report says it failed).
    chosen = next((t for t in steps if t.passed), None) or min(steps, key=lambda t: t.drop)
    result = FallbackResult(search.fmt, config.fallback_dtype, full, tuple(ranking),
                            tuple(steps), chosen, search.evaluations)
    ctx.progress.info(f"int8 fallback: float {', '.join(chosen.float_layers)} "
                      f"({search.evaluations} evaluations, drop {chosen.drop:.4f})")
    ctx.record.add_section(result)
    return quantize(float_state.replace(float_layers=chosen.float_layers))


class _Search:
    def __init__(self, float_state: ModelState, ctx: Context, backend: Backend,
                 quantize: Quantize, folder: Path) -> None:
        self.float_state, self.ctx, self.backend, self.quantize = float_state, ctx, backend, quantize
        self.folder = folder
        self.fmt = ctx.formats[0] if ctx.formats else "tflite"
        self.evaluations = 0

    def measure(self, state: ModelState | None, float_layers: tuple[str, ...]) -> Trial:
        """Build the artifact with `float_layers` float, run it on val, apply the gate."""
        if state is None:
            state = self.quantize(self.float_state.replace(float_layers=float_layers))
        path = self.folder / f"candidate-{self.evaluations + 1}.{self.fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        written = export_checked(self.backend, state, self.fmt, path, self.ctx)
        trial = _evaluate(written, float_layers, self.ctx)
        self.evaluations += 1
        written.unlink(missing_ok=True)
        return trial

    def singles(self, layers: tuple[str, ...]) -> dict[str, Trial]:
        """Each layer left float on its own; a layer whose candidate cannot be built (its
        converter cannot keep it float) is skipped with a note, not the end of the run."""
        found = {}
        for layer in layers:
            try:
                found[layer] = self.measure(None, (layer,))
            except BackendUnavailableError as exc:
                self.ctx.progress.info(f"int8 fallback: {layer} cannot be left float "
                                       f"({first_line(exc, 120)}); not a candidate")
        return found

    def greedy(self, ranked: list[str], singles: dict[str, Trial], limit: int) -> list[Trial]:
        steps = [singles[ranked[0]]]
        while not steps[-1].passed and len(steps) < min(limit, len(ranked)):
            steps.append(self.measure(None, tuple(ranked[:len(steps) + 1])))
        return steps


def _evaluate(path: Path, float_layers: tuple[str, ...], ctx: Context) -> Trial:
    from compressor.runtimes import open_runtime

    metric = ctx.metric or ctx.validation.metric
    x_val, y_val = ctx.data.val
    outputs = open_runtime(path).predict(x_val)
    value = metric_value(metric, outputs, y_val, ctx.reference_outputs, ctx.validation.output)
    worse_by = drop(metric, ctx.baseline_value, value)
    return Trial(float_layers=float_layers, metric_value=value, drop=worse_by,
                 fidelity=metric_value("fidelity", outputs, y_val, ctx.reference_outputs),
                 size_bytes=path.stat().st_size,
                 passed=gate_passes(ctx.validation, value, worse_by))


def _ranked(full: Trial, singles: dict[str, Trial]) -> list[RankedLayer]:
    ranking = [RankedLayer(layer, sensitivity=full.drop - trial.drop,
                           fidelity_gain=trial.fidelity - full.fidelity,
                           size_cost_bytes=trial.size_bytes - full.size_bytes)
               for layer, trial in singles.items()]
    return sorted(ranking, key=lambda r: (r.sensitivity, r.fidelity_gain), reverse=True)


def _require_gate(ctx: Context) -> None:
    if ctx.validation is None or ctx.reference_outputs is None or ctx.baseline_value is None:
        raise RecipeError("quantize fallback: auto measures candidates against the recipe's "
                          "accuracy gate; run it through compress() / the compress command, or "
                          "set fallback: none")
    if ctx.data.val is None:
        raise RecipeError("quantize fallback: auto needs a val split to measure layers on")
