"""The language-model backend's handler table.

apply: weight-only int4 (GPTQ or round-to-nearest, per group) and int8 (round to nearest, per
group of 128: at 8 bits GPTQ buys nothing measurable) choose the integers every linear is
stored with; float16 needs nothing before export.
export: the ONNX route is onnxruntime-genai's model builder fed a GPTQ-format checkpoint of
our integers (it packs them as MatMulNBits without rounding again); the TFLite route is
litert-torch's generative converter (backends/llm/litert.py).

Importing this module imports no framework.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor.errors import BackendUnavailableError
from compressor.schemes import (Float16, Float32, Int4Qat, Int4WeightOnly, Int8WeightOnly,
                                Scheme, apply_handler, export_handler)

if TYPE_CHECKING:
    from compressor.core.context import Context, ModelState

KIND = "llm"
# int4 QAT's starting integers are chosen on the first windows only, as many as int4's default
# (GPTQ's cost grows with them; training then sees them all)
START_WINDOWS = 32


def weight_only_plan(scheme: Scheme, model: Any) -> Any:
    """The bits / groups / algorithm `model`'s weights get under `scheme`, read from the
    storage it declares (decoders/storage.py, which the planner counts too; None: float).
    int8: a zero point per group of 128, or the largest power of two dividing every width.
    int4: symmetric unless the recipe says otherwise. LiteRT computes only symmetric int4, so
    asymmetric integers would be rounded a second time there (tiny trained Llama, GPTQ int4 g32:
    the TFLite file +2.59% perplexity when rounded again, +1.05% symmetric), and in ONNX the
    zero points (4 bits per group of 32 beside a 32-bit scale) buy about a tenth of a point of
    perplexity (bench Llama, GPTQ with clip search: +0.40% symmetric, +0.31% asymmetric). One
    set of integers is then exact in both files."""
    from compressor.backends.llm.quantize import WeightOnlyPlan, widest_group

    storage = scheme.storage
    if storage is None or not storage.linears.quantized:
        return None
    grid = storage.linears
    if any(other != grid for other in storage.grids):
        raise BackendUnavailableError(
            f"{scheme.label} stores the lm_head or embedding on a grid of its own; the "
            "language-model route quantizes every weight matrix on one grid")
    group = widest_group(model, grid.group_size) if grid.fit_group else grid.group_size
    return WeightOnlyPlan(grid.bits, group, getattr(scheme, "algorithm", "rtn"), grid.symmetric,
                          storage.int8_budget)


@apply_handler(Int4WeightOnly, KIND)
def _int4(backend: Any, state: ModelState, scheme: Int4WeightOnly, ctx: Context) -> ModelState:
    return _quantized(state, weight_only_plan(scheme, state.model), ctx)


@apply_handler(Int8WeightOnly, KIND)
def _int8(backend: Any, state: ModelState, scheme: Int8WeightOnly, ctx: Context) -> ModelState:
    return _quantized(state, weight_only_plan(scheme, state.model), ctx)


@apply_handler(Int4Qat, KIND)
def _int4_qat(backend: Any, state: ModelState, scheme: Int4Qat, ctx: Context) -> ModelState:
    """int4's integers, then fine-tuned with fake quantization (backends/llm/qat.py)."""
    from compressor.backends.fine_tuning import start_history
    from compressor.backends.llm.lm_train import facts_line
    from compressor.backends.llm.qat import train

    windows = ctx.data.train[0]
    started = _quantized(state, weight_only_plan(scheme, state.model), ctx,
                         windows[:START_WINDOWS])
    trained, facts = train(state.model, started.model.quantized, windows, scheme, ctx.progress,
                           ctx.formats, start_history(ctx, "int4 QAT"))
    ctx.progress.info(facts_line("int4 QAT", facts))
    ctx.record.add_note("training", facts)
    return state.replace(model=trained)


def _quantized(state: ModelState, plan: Any, ctx: Context, calibration: Any = None
               ) -> ModelState:
    import dataclasses

    from compressor.backends.llm.candidates import choose_weights
    from compressor.backends.llm.smoothing import choose_smoothing
    from compressor.backends.torch.threads import on_free_cpus

    if calibration is None and ctx.data.train is not None:
        calibration = ctx.data.train[0]
    fitted = _fitted_budget(ctx)
    if fitted is not None and fitted < plan.int8_budget:
        ctx.progress.info(f"quantize: int8 share cut from {plan.int8_budget:g}x to {fitted:g}x "
                          "the int4 bytes: what the target has room for (the plan)")
        plan = dataclasses.replace(plan, int8_budget=fitted)
    grid = ("symmetric" if plan.symmetric else "asymmetric") if plan.bits == 4 else ""
    mixing = f", up to {plan.int8_budget:g}x its bytes with int8 where it measures closer" \
        if plan.bits == 4 and plan.int8_budget > 1 else ""
    ctx.progress.info(f"quantize: int{plan.bits} weights, {grid} groups of {plan.group_size}, "
                      f"{plan.algorithm}{mixing}" + (
                          f" on {len(calibration)} calibration windows"
                          if plan.algorithm != "rtn" and calibration is not None else ""))
    with on_free_cpus():     # GPTQ and the candidates' scoring: torch's heaviest CPU work
        smoothing = choose_smoothing(state.model, plan, calibration, ctx.formats,
                                     ctx.progress.info)
        if smoothing is not None:
            ctx.record.add_note_entry("candidates", "smooth", smoothing)
        quantized, candidates = choose_weights(state.model, plan, calibration,
                                               ctx.progress.task, ctx.progress.info, ctx.formats)
    if candidates is not None:
        ctx.record.add_note_entry("candidates", "quantize", candidates)
    return state.replace(model=state.model.with_quantized(quantized))


def _fitted_budget(ctx: Context) -> float | None:
    """The int8 share the plan made before any work left room for on the --target."""
    plans = (ctx.plan or {}).get("plans") or [{}]
    return plans[0].get("int8_budget")


# --- export: (scheme, module, function, made_by) per format ----------------------------------

GENAI = ("onnxruntime-genai model builder fed a GPTQ-format checkpoint of compressor's {bits} "
         "integers (MatMulNBits bits {n}, accuracy_level 4; embedding GatherBlockQuantized), {how}")
EXPORTS = {
    "onnx": (
        (Float32, "genai", "write_genai_folder", "onnxruntime-genai model builder, float32 "
         "(GroupQueryAttention, KV cache sized to the context)"),
        (Float16, "genai", "write_genai_folder", "onnxruntime-genai model builder at float32, "
         "weights stored float16 behind Casts (float32 compute)"),
        (Int8WeightOnly, "genai", "write_genai_folder",
         GENAI.format(bits="int8", n=8, how="round to nearest")),
        (Int4WeightOnly, "genai", "write_genai_folder",
         GENAI.format(bits="int4", n=4, how="the recipe's algorithm (GPTQ by default)")),
    ),
    "tflite": (
        (Float32, "litert", "write_litert_model", "litert-torch 0.10.0 export_hf (the "
         "transformers model traced with a KV cache: prefill_<T> / decode signatures), float32"),
        (Float16, "litert", "write_litert_model", "litert-torch 0.10.0 export_hf, float16 "
         "weights (DEQUANTIZE to float32 at load)"),
        (Int8WeightOnly, "litert", "write_litert_model", "litert-torch 0.10.0 export_hf + "
         "compressor's int8 integers where they are on LiteRT's grid (symmetric per output "
         "channel), the rest rounded again (notes.tflite_weights); activations int8 per token "
         "at run time"),
        (Int4WeightOnly, "litert", "write_litert_model", "litert-torch 0.10.0 export_hf + "
         "compressor's int4 integers where they are on LiteRT's grid (symmetric per block, "
         "bfloat16 scales), the rest rounded again (notes.tflite_weights); activations int8 per "
         "token at run time"),
    ),
    "gguf": (
        (Float32, "gguf_write", "write_gguf_model", "compressor's GGUF writer, F32 (llama.cpp)"),
        (Float16, "gguf_write", "write_gguf_model", "compressor's GGUF writer, F16 (BF16 for a "
         "bfloat16 checkpoint); norms F32"),
        (Int8WeightOnly, "gguf_write", "write_gguf_model", "compressor's GGUF writer: Q8_0 "
         "blocks of compressor's int8 integers (symmetric ones kept, others rounded again by "
         "llama.cpp's quantizer, notes.gguf_weights)"),
        (Int4WeightOnly, "gguf_write", "write_gguf_model", "compressor's GGUF writer: Q4_0 "
         "blocks of compressor's int4 integers (no second rounding), its int8 matrices as Q8_0"),
    ),
}


def _route(module_name: str, function: str):
    """The export handler calling `function(state, scheme, path, ctx)` of
    compressor/backends/llm/<module_name>.py (imported when it runs: it imports torch)."""
    def write(backend: Any, state: ModelState, scheme: Scheme, path: Path, ctx: Context) -> Path:
        module = importlib.import_module(f"compressor.backends.llm.{module_name}")
        return getattr(module, function)(state, scheme, path, ctx)

    return write


for _fmt, _routes in EXPORTS.items():
    for _scheme, _module, _function, _made_by in _routes:
        export_handler(_scheme, KIND, _fmt, made_by=_made_by)(_route(_module, _function))
