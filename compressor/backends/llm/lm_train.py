"""The one training loop of the language-model backend: int4 QAT (qat.py), width pruning's
fine-tuning and distillation (lm_steps.py) all run `train_windows`.

Batches of the recipe's calibration windows (a new permutation each epoch, seed 0), the
recipe's optimizer and lr schedule (warmup, cosine; backends/fine_tuning.py), a progress bar
with the running loss and tokens/s, and the training facts report.json records under
`training` (steps, seconds, tokens/s, the training's peak RSS, the loss at the start and the
end). Under `--workers N` (torchrun) every rank takes its share of each batch (the same
permutation everywhere), starts from rank 0's weights and sums the share-weighted gradients
before each step: the steps of one process training the whole batch.

The loss of a batch is the caller's; `distillation_loss` is the one QAT and distill share:
KL(teacher || student) of the next-token distributions at a temperature (x T^2), plus a weight
of the hard next-token cross-entropy, the teacher's logits computed batch by batch. Losses are
summed one window at a time under checkpointing (`_per_window`), so a 49k vocabulary's float
copies exist for one window only.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import compressor.backends.llm.lm_epochs as lm_epochs
import compressor.backends.llm.master_weights as master_weights
import compressor.backends.torch.ranks as ranks
from compressor.backends.fine_tuning import TrainingHistory, lr_at, peak_lr
from compressor.backends.torch.threads import on_free_cpus
from compressor.core.memory import TrainingMeter
from compressor.errors import DataError

SAMPLE_S = 0.01      # the peak-RSS sampler's interval while training
MIN_WINDOWS = 8
# float logits a loss chunk holds at a time (_per_window): one window of most models. The
# small bench Llama's int4_qat (8 windows of 256 tokens, 1,024 vocabulary) held 186 / 140 MB
# of heap at its peak in float32 / bf16 with the batch as one chunk, 148 / 94 MB a window at
# a time, in the same seconds (the bf16 run's float copies of the logits were most of it)
CHUNK_BYTES = 2**20


def float32_student(model: Any) -> Any:
    """A float32 copy of `model` in train mode: what every LM training step trains."""
    return copy.deepcopy(model).to(torch.float32).train()


def in_dtype_of(student: Any, original: Any) -> Any:
    """The trained `student` in eval mode, in the dtype `original` was loaded in."""
    return student.to(next(original.parameters()).dtype).eval()


def check_windows(windows: np.ndarray, what: str) -> None:
    """DataError before any work when the text gave too few windows to train on."""
    if len(windows) < MIN_WINDOWS:
        raise DataError(f"{what} needs at least {MIN_WINDOWS} training windows, the text gave "
                        f"{len(windows)}; give a longer --data text")


def autocast(bf16: bool) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def frozen_teacher(model: Any, bf16: bool) -> Any:
    """The teacher in eval mode: a bfloat16 copy under bf16 precision, else the model itself
    (it is only read, under no_grad)."""
    teacher = copy.deepcopy(model).to(torch.bfloat16) if bf16 else model
    return teacher.eval()


def distillation_loss(student: Any, teacher: Any, ids: torch.Tensor, temperature: float,
                      hard_weight: float, bf16: bool, loss: str = "kl") -> torch.Tensor:
    """One batch's loss: KL(teacher || student) per token at `temperature` (x T^2, as
    distillation scales it; `loss: mse`: the mean squared difference of the logits), mixed
    with the next-token cross-entropy: (1 - hard_weight) x soft + hard_weight x hard."""
    with torch.no_grad(), autocast(bf16):
        target = teacher(input_ids=ids, use_cache=False).logits
    with autocast(bf16):
        logits = student(input_ids=ids, use_cache=False).logits

    def summed(student_rows: torch.Tensor, teacher_rows: torch.Tensor, labels: torch.Tensor
               ) -> torch.Tensor:
        student_rows, teacher_rows = student_rows.float(), teacher_rows.float()
        if loss == "mse":
            soft = torch.nn.functional.mse_loss(student_rows, teacher_rows, reduction="sum")
            soft = soft / student_rows.shape[-1]
        else:
            t = temperature
            soft = torch.nn.functional.kl_div(
                torch.log_softmax(student_rows / t, dim=-1),
                torch.log_softmax(teacher_rows / t, dim=-1),
                log_target=True, reduction="sum") * t * t
        if not hard_weight:
            return soft
        hard = torch.nn.functional.cross_entropy(student_rows, labels, reduction="sum")
        return (1 - hard_weight) * soft + hard_weight * hard

    return _per_window(summed, logits, target, ids)


def next_token_loss(student: Any, ids: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The text's own next tokens as labels (fine-tuning without a teacher)."""
    with autocast(bf16):
        logits = student(input_ids=ids, use_cache=False).logits

    def summed(rows: torch.Tensor, _: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(rows.float(), labels, reduction="sum")

    return _per_window(summed, logits, logits, ids)


def _per_window(summed: Callable, logits: torch.Tensor, target: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    """The mean over every predicted token of `summed(student rows, teacher rows, labels)`.
    When the batch's float logits exceed CHUNK_BYTES, a few windows at a time under activation
    checkpointing: the float copies, log-softmaxes and their gradients ([tokens, vocab] each,
    0.4 GB per copy for 8 windows of 256 tokens of a 49k vocabulary) then exist for one chunk,
    not for the batch (recomputed in backward; a tiny model's batch is one chunk)."""
    from torch.utils.checkpoint import checkpoint

    windows, tokens = len(ids), ids.shape[1] - 1
    per_chunk = max(1, CHUNK_BYTES // (tokens * logits.shape[-1] * 4))
    if per_chunk >= windows:
        total = summed(logits[:, :-1].reshape(-1, logits.shape[-1]),
                       target[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        return total / (windows * tokens)
    total = logits.new_zeros((), dtype=torch.float32)
    for first in range(0, windows, per_chunk):
        rows = slice(first, first + per_chunk)
        total = total + checkpoint(
            summed, logits[rows, :-1].reshape(-1, logits.shape[-1]),
            target[rows, :-1].reshape(-1, logits.shape[-1]), ids[rows, 1:].reshape(-1),
            use_reentrant=False)
    return total / (windows * tokens)


def optimizer_for(config: Any, groups: list[dict]) -> torch.optim.Optimizer:
    """The recipe's optimizer over parameter `groups` ({"params", "scale"}: the group's lr is
    `scale` x the schedule's)."""
    groups = [g for g in groups if g["params"]]
    lr = peak_lr(config)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=1e-4)
    return torch.optim.Adam(groups, lr=lr)


def train_windows(windows: np.ndarray, config: Any, student: Any,
                  loss_of: Callable[[torch.Tensor], torch.Tensor],
                  optimizer: torch.optim.Optimizer, progress: Any, label: str,
                  history: TrainingHistory | None = None) -> dict:
    """`config.epochs` passes over `windows` in batches of `config.batch_size`, one optimizer
    step per batch at the schedule's rate (`precision: bf16`: `student` reads its weights as
    bfloat16 from float32 masters meanwhile, master_weights.py), on the CPUs other processes
    leave free (threads.py); each epoch judged on held-back windows, the best kept
    (lm_epochs.py: keep_best, early_stop; recorded in `history`); the training facts for
    report.json."""
    windows, val = lm_epochs.held_back(windows, config)
    batch = min(config.batch_size, len(windows))
    per_epoch = len(windows) // batch
    steps = max(1, config.epochs * per_epoch)
    rank, size = _ranks(optimizer, batch, progress)
    judge = lm_epochs.EpochJudge(val, batch, loss_of, _parameters(optimizer), config, history)
    order = np.random.default_rng(0)
    losses, tokens = [], 0
    with TrainingMeter(SAMPLE_S) as meter, on_free_cpus() as threads, \
            master_weights.bf16_weights(student, config.precision == "bf16"), \
            progress.task(f"{label} ({config.precision})", steps) as advance:
        for step in range(steps):
            if step % per_epoch == 0:
                permutation = order.permutation(len(windows))
            first = (step % per_epoch) * batch
            chosen = windows[permutation[first:first + batch]]
            ids = torch.as_tensor(chosen[rank::size])
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, steps, config) * group["scale"]
            loss = loss_of(ids) * (len(ids) / len(chosen))   # this rank's share
            meter.mark()
            loss.backward()
            loss = float(loss.detach())
            if size > 1:
                ranks.summed_gradients(_parameters(optimizer))
                loss = ranks.summed(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            tokens += chosen.size
            advance(1, f"loss {np.mean(losses[-10:]):.4f}, {tokens / meter.elapsed():,.0f} tokens/s")
            if (step + 1) % per_epoch == 0 and judge.end_epoch(
                    (step + 1) // per_epoch, float(np.mean(losses[-per_epoch:])),
                    lr_at(step, steps, config)):
                break
        judge.restore_best()
    return {"steps": len(losses), "batch_windows": batch, "tokens": tokens, "ranks": size,
            "val_windows": len(val), "kept_epoch": judge.kept_epoch,
            "threads": threads,
            **meter.facts(), "tokens_per_s": round(tokens / meter.seconds, 1),
            "precision": config.precision, "lr": peak_lr(config),
            "loss_first": round(float(np.mean(losses[:5])), 6),
            "loss_last": round(float(np.mean(losses[-5:])), 6)}


def _ranks(optimizer: torch.optim.Optimizer, batch: int, progress: Any) -> tuple[int, int]:
    """(this rank, the ranks) of a data-parallel run, every rank starting from rank 0's
    weights; (0, 1) alone. A batch must give every rank a window."""
    rank, size = ranks.rank_and_size()
    if size > 1:
        if batch < size:
            raise DataError(f"a batch of {batch} windows cannot be shared by {size} ranks; "
                            f"set batch_size >= {size} or use fewer --workers")
        ranks.same_start(_parameters(optimizer))
        progress.info(f"data-parallel fine-tuning on {size} ranks (gloo): each takes "
                      f"1/{size} of every batch of {batch} windows")
    return rank, size


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def facts_line(label: str, facts: dict) -> str:
    """The line a training step prints when it ends."""
    return (f"{label}: {facts['steps']} steps in {facts['seconds']:.0f} s "
            f"({facts['tokens_per_s']:,.0f} tokens/s, {facts['precision']}), loss "
            f"{facts['loss_first']:.4f} -> {facts['loss_last']:.4f}")
