"""A language model's session: text windows instead of arrays, perplexity instead of accuracy,
and the torch reference every artifact is compared with (next-token choices, log-probabilities
of the held-out text, greedy continuations of fixed prompts).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import compressor.tasks.lm.metrics as lm_metrics
from compressor.core.context import Context
from compressor.errors import UsageError
from compressor.core.progress import Progress
from compressor.config.recipe import Recipe
from compressor.config.steps import PruneConfig, QuantizeConfig, ValidateConfig
from compressor.tasks.lm.evaluate import GREEDY_TOKENS, greedy_prompts
from compressor.core.workspace import make_work_folder
from compressor.tasks.base import Opened, OpenRequest, describe_ref

DEFAULT_CONTEXT = 4096   # the KV cache an artifact is built for, unless --context says


def lm_validation(recipe: Recipe) -> ValidateConfig:
    """The recipe's gate for a language model: a classifier recipe (int8, fp16) is gated by its
    `max_increase` in perplexity, since a language model has no labels to score."""
    validation = recipe.validation
    if validation.metric == "perplexity":
        return validation
    return validation.model_copy(update={"metric": "perplexity", "output": None})


def window_settings(recipe: Recipe, validation: ValidateConfig) -> dict[str, int | None]:
    calibration = next((getattr(step, "calibration_windows", None) for step in recipe.steps
                        if isinstance(step, QuantizeConfig)), None)
    return {"calibration_windows": calibration, "eval_windows": validation.eval_windows,
            "window": validation.window}


def artifact_context(model: Any, context: int | None) -> int:
    """The context length the artifacts' KV cache is sized to: never blindly the model's
    maximum (128k positions of KV cache is what runs an 8 GB board out of memory)."""
    limit = getattr(model.config, "max_position_embeddings", None) or DEFAULT_CONTEXT
    if context is None:
        return min(limit, DEFAULT_CONTEXT)
    if context > limit:
        raise UsageError(f"--context {context} is longer than the model's {limit} positions; "
                         f"use --context {limit} or less")
    return context


def check_plan_fits(model: Any, recipe: Recipe, target: str | None, context: int | None,
                    force_plan: bool, devices: int | None = None) -> dict | None:
    """`compress plan`'s verdict before any work: a recipe (built-in or a user's file) whose
    plan cannot fit the target is refused (exit 4) unless --force-plan; the plan of one that
    fits (report.json `plan`). The model's description is read once, from config.json and the
    weights' headers: a config.json that does not describe the weights beside it is refused
    (ConfigMismatchError, exit 2) before transformers loads it, with or without a target. A
    model that is no path or built-in name (`module:function`, a Python object) has no shapes
    to read yet: `plan_loaded` plans it once loaded."""
    if not planned_before_loading(model):
        return None
    import compressor.plan  # noqa: F401  (installs the meta-device counter: any family)
    from compressor.decoders.headers import describe
    from compressor.errors import ConfigMismatchError, ModelLoadError

    gated = target is not None and not force_plan
    try:
        describe(str(model))
    except ModelLoadError as exc:   # without a plan to make, the loader says what is wrong
        if gated or isinstance(exc, ConfigMismatchError):
            raise
        return None
    if not gated:
        return None
    from compressor.plan import plan_gate

    return plan_gate(str(model), recipe, target, context,   # None: the model's, at most 4096
                     devices=devices)   # --devices K: each stage on its own board


def planned_before_loading(model: Any) -> bool:
    """Whether `check_plan_fits` reads `model`'s plan before loading: a path, a built-in name
    (not a `module:function` reference, whose model exists only once it is called)."""
    from compressor.backends.model_kinds import is_callable_ref

    if not isinstance(model, (str, Path)):
        return False
    return Path(model).exists() or not is_callable_ref(str(model))


def plan_loaded(request: OpenRequest, loaded: Any) -> dict | None:
    """The plan `check_plan_fits` could not make before loading, from the loaded model's
    config: refused (DeviceBudgetError, exit 4) when it does not fit, else the plan."""
    if request.target is None or request.force_plan or planned_before_loading(request.model_ref):
        return None
    from compressor.plan import plan_gate

    return plan_gate(loaded.model.config.to_dict(), request.recipe, request.target,
                     request.context,   # None: the model's positions, at most 4096
                     devices=request.devices)


def check_quantize_steps(loaded: Any, recipe: Recipe) -> None:
    """Refuse before any work what a language model's quantize step cannot do: a group size
    that does not divide its widths, as an earlier width-pruning step leaves them (RecipeError
    naming the step and the size that fits)."""
    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.quantize import check_grid_fits
    from compressor.errors import RecipeError

    pruned_width = None   # the MLP width an earlier prune step keeps
    for index, step in enumerate(recipe.steps):
        if isinstance(step, PruneConfig):
            pruned_width = _pruned_mlp_width(loaded, step) or pruned_width
        if isinstance(step, QuantizeConfig):
            plan = weight_only_plan(step.scheme, loaded)
            try:
                check_grid_fits(loaded, plan)
            except RecipeError as exc:
                raise RecipeError(f"steps.{index}: {exc}") from None
            if plan is not None and pruned_width and pruned_width % plan.group_size:
                raise RecipeError(
                    f"steps.{index}: quantize group_size {plan.group_size} does not divide the "
                    f"MLP width {pruned_width} the prune step keeps; give the prune step "
                    f"channel_multiple: {plan.group_size}")


def _pruned_mlp_width(loaded: Any, step: PruneConfig) -> int | None:
    """The MLP width a width-pruning step keeps (None: it cannot prune this model; the step
    says why when it runs)."""
    import compressor.backends.llm.width_prune as width_prune

    if step.structure != "channel" or step.sparsity is None:
        return None
    if width_prune.refusal(loaded.model, step.sparsity, step.channel_multiple) is not None:
        return None
    return width_prune.kept_channels(loaded.model, step.sparsity, step.channel_multiple)


def open_lm(request: OpenRequest, backend: Any, loaded: Any) -> Opened:
    """A language model's data (the recipe's text windows, tokenized by its own tokenizer), the
    torch reference (teacher-forced outputs, greedy continuations) and its perplexity."""
    from compressor.tasks.lm.windows import text_windows

    if request.metric is not None:
        raise UsageError("a custom metric is for classifier models; language models are scored "
                         "by perplexity on held-out text")
    from compressor.backends.llm.routes import writable_formats
    from compressor.tasks.lm.split import check_split_asked

    recipe = request.recipe
    validation = lm_validation(recipe)
    planned = plan_loaded(request, loaded)   # module:function: planned once loaded
    formats, dropped = writable_formats(loaded.model.config.to_dict(), request.formats,
                                        request.formats_asked)
    check_split_asked(request.devices, formats)   # module:function: known once loaded
    check_quantize_steps(loaded, recipe)
    backend.preflight(loaded, tuple(recipe.steps), formats)   # prune / distill it cannot take
    teacher = teacher_of(request, loaded)
    progress = Progress(quiet=request.quiet)
    if dropped:
        progress.info(dropped)
    data = text_windows(loaded, request.data, window_settings(recipe, validation), progress)
    info = backend.describe(loaded)
    x_val = data.val[0]
    progress.info(f"reference: the original model on {len(x_val)} held-out windows of "
                  f"{x_val.shape[1]} tokens")
    reference = backend.predict(loaded, x_val)
    reference[lm_metrics.GREEDY] = np.array(
        [backend.generate(loaded, prompt, GREEDY_TOKENS) for prompt in greedy_prompts(x_val)])
    baseline = lm_metrics.perplexity(reference)
    kv_context = artifact_context(loaded.model, request.context)
    workdir = make_work_folder()   # last: nothing above may leave it behind
    ctx = Context(data=data, progress=progress, workdir=workdir, seed=request.seed,
                  formats=formats, validation=validation, reference_outputs=reference,
                  baseline_value=baseline, inputs=info.inputs, outputs=info.outputs,
                  context=kv_context, plan=planned, teacher=teacher)
    if planned is not None:   # report.json `plan`, as a path's plan before loading
        ctx.record.add_note("plan", planned)
    if loaded.notes:   # what loading decided (a .gguf's grids kept): report.json `notes`
        ctx.record.add_note("notes", list(loaded.notes))
        for note in loaded.notes:
            ctx.progress.info(note)
    entry = None
    if teacher is not None:   # report.json `teacher`
        entry = {"model": "the original model" if teacher is loaded else
                 describe_ref(request.teacher), "params": backend.describe(teacher).params}
    return Opened(info=info, ctx=ctx, teacher_entry=entry)


def teacher_of(request: OpenRequest, loaded: Any) -> Any:
    """A distill recipe's teacher: --teacher (same vocabulary) or the original model."""
    if not request.recipe.needs_teacher:
        return None
    from compressor.backends.llm.lm_steps import load_teacher

    return load_teacher(request.teacher, loaded)
