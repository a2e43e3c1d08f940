"""A language model's prune (width, width_prune.py) and distill steps, what they refuse before
any work (`check_steps`), and the teacher of a distill step (`load_teacher`).

prune, `structure: channel`: MLP channels and KV groups ranked on the calibration windows and
removed, a new smaller model of the same family; with `epochs` > 0 it is then fine-tuned on
the text's next tokens (no teacher). report.json `pruning`: the widths and parameters before
and after (and the fine-tuning's training facts).
distill: the student (the state's model, e.g. the pruned one) trained against the teacher (the
original model unless --teacher names another with the same vocabulary): KL of the next-token
distributions at `temperature` (loss: mse: of the logits) weighted `alpha`, the text's next
tokens 1 - alpha, on the calibration windows for `epochs`; report.json `distillation`: the
training facts (lm_train.py, the loop int4 QAT runs too).
"""
from __future__ import annotations

from typing import Any

from compressor.backends.fine_tuning import start_history
from compressor.backends.llm.model import LoadedLm
from compressor.errors import ModelLoadError, RecipeError

DISTILL_FIX = "language models distil from the original model (or --teacher) on next-token outputs"


def check_steps(loaded: LoadedLm, steps: tuple[Any, ...]) -> None:
    """RecipeError (exit 2) naming the step, before any work, for what a language model's
    prune / distill step cannot do."""
    import compressor.backends.llm.width_prune as width_prune

    quantized = False
    for number, step in enumerate(steps, start=1):
        where = f"step {number} `{step.kind}`"
        if step.kind == "quantize":
            quantized = True
        if step.kind == "prune":
            if step.structure != "channel":
                raise RecipeError(f"{where}: language models are width-pruned (whole MLP channels "
                                  "and attention heads); set `structure: channel`")
            reason = width_prune.refusal(loaded.model, step.sparsity, step.channel_multiple)
            if reason:
                raise RecipeError(f"{where}: {reason}")
        if step.kind == "distill":
            if step.feature_pairs or step.guide_later_steps:
                raise RecipeError(f"{where}: feature_pairs and guide_later_steps are for "
                                  f"classifier models; {DISTILL_FIX}")
            if quantized:
                raise RecipeError(f"{where}: distilling a quantized language model would lose "
                                  "its integers; put distill before quantize")


def prune(state: Any, config: Any, ctx: Any) -> Any:
    import compressor.backends.llm.lm_train as lm_train
    import compressor.backends.llm.width_prune as width_prune

    loaded = state.model
    check_steps(loaded, (config,))
    if loaded.quantized:
        raise RecipeError("a prune step after quantize would lose the integers; prune first")
    windows = ctx.data.train[0]
    before = width_prune.shape_of(loaded.config)
    kept = width_prune.plan(loaded.model, windows, config.sparsity, config.channel_multiple)
    model = width_prune.pruned_model(loaded.model, kept)
    after = width_prune.shape_of(model.config)
    facts = {"structure": "width", "windows": int(len(windows)),
             "params_before": width_prune.params(loaded.model),
             "params_after": width_prune.params(model),
             **{f"{key}_before": b for key, b in zip(WIDTHS, before)},
             **{f"{key}_after": a for key, a in zip(WIDTHS, after)}}
    ctx.progress.info(f"prune: MLP {before[3]} -> {after[3]} channels, {before[0]}/{before[1]} -> "
                      f"{after[0]}/{after[1]} query/KV heads per layer; {facts['params_before']:,} "
                      f"-> {facts['params_after']:,} parameters")
    if config.epochs > 0:
        lm_train.check_windows(windows, "fine-tuning after pruning")
        student, bf16 = model.float().train(), config.precision == "bf16"
        optimizer = lm_train.optimizer_for(config, [{"params": list(student.parameters()),
                                                     "scale": 1.0}])
        facts["training"] = lm_train.train_windows(
            windows, config, student, lambda ids: lm_train.next_token_loss(student, ids, bf16),
            optimizer, ctx.progress, "fine-tune after pruning",
            start_history(ctx, "fine-tune after pruning"))
        model = lm_train.in_dtype_of(student, loaded.model)
        ctx.progress.info(lm_train.facts_line("fine-tune after pruning", facts["training"]))
    ctx.record.add_note("pruning", facts)
    return state.replace(model=LoadedLm(model=model, tokenizer=loaded.tokenizer, source=None,
                                        notes=loaded.notes))


WIDTHS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")


def distill(state: Any, config: Any, ctx: Any) -> Any:
    import torch

    import compressor.backends.llm.lm_train as lm_train

    loaded = state.model
    check_steps(loaded, (config,))
    if loaded.quantized:
        raise RecipeError("distilling a quantized language model would lose its integers; put "
                          "distill before quantize")
    windows = ctx.data.train[0]
    lm_train.check_windows(windows, "distillation")
    bf16 = config.precision == "bf16"
    student = lm_train.float32_student(loaded.model)
    teacher = lm_train.frozen_teacher(ctx.teacher.model, bf16)
    optimizer = lm_train.optimizer_for(config, [{"params": list(student.parameters()),
                                                 "scale": 1.0}])

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        return lm_train.distillation_loss(student, teacher, ids, config.temperature,
                                          1.0 - config.alpha, bf16, config.loss)

    facts = lm_train.train_windows(windows, config, student, loss_of, optimizer, ctx.progress,
                                   "distill", start_history(ctx, "distill"))
    ctx.progress.info(lm_train.facts_line("distill", facts))
    ctx.record.add_note("distillation", {**facts, "temperature": config.temperature,
                                         "alpha": config.alpha, "loss": config.loss})
    return state.replace(model=LoadedLm(model=lm_train.in_dtype_of(student, loaded.model),
                                        tokenizer=loaded.tokenizer,
                                        source=None, notes=loaded.notes))


def load_teacher(given: Any, student: LoadedLm) -> LoadedLm:
    """The distill steps' teacher: `given` (an HF folder, a .gguf, module:function; the
    compressor LM loader) or, when None, the original model itself. A teacher whose
    vocabulary differs from the student's is refused (ModelLoadError, exit 2)."""
    from compressor.backends.llm.load import load_lm

    if given is None:
        return student
    teacher = load_lm(given)
    problem = vocabulary_difference(teacher, student)
    if problem:
        raise ModelLoadError(f"the teacher {given} cannot teach this model: {problem}; distil "
                             "from a model with the same tokenizer")
    return teacher


def vocabulary_difference(teacher: LoadedLm, student: LoadedLm) -> str | None:
    sizes = teacher.config.vocab_size, student.config.vocab_size
    if sizes[0] != sizes[1]:
        return f"its vocabulary has {sizes[0]} ids, the student's {sizes[1]}"
    if teacher.tokenizer is None or student.tokenizer is None:
        return None
    ours = {token: i for token, i in student.tokenizer.get_vocab().items() if i < sizes[1]}
    theirs = teacher.tokenizer.get_vocab()
    differ = [token for token, i in ours.items() if theirs.get(token) != i]
    if differ:
        return (f"its tokenizer maps {len(differ)} of the student's {len(ours)} tokens to other "
                f"ids (e.g. {differ[0]!r})")
    return None
