"""int4 quantization-aware training for a language model (`int4_qat`: scheme Int4Qat).

From the `int4` integers (the candidate search's winner: GPTQ / clip search, int8 mixed in), a
copy of the model is fine-tuned with every stored matrix fake-quantized on exactly its stored
grid (fake_quant.py), the original model as teacher: the loss is KL(teacher || student) of
the next-token distributions at `temperature` (plus `hard_weight` x the next-token
cross-entropy), the teacher's logits computed batch by batch, never held for the corpus. The
training windows are the recipe's calibration text (the same windows the starting integers
were chosen on; the held-out windows validate). Norms and biases train too (they are stored in
float). At the end the trained integers are read from the same computation as the forward, so
the artifacts store what was trained, rounded nowhere else.

`precision: bf16`: the forward and backward under bfloat16 autocast, the teacher held in
bfloat16; the student's weights and Adam's state stay float32 (master copies), so the integers
are chosen from float32 latent weights. report.json `training` records seconds, tokens/s,
the training's peak RSS and the loss, so fp32 and bf16 runs compare side by side.
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
from typing import Any

import numpy as np
import torch

import compressor.backends.llm.fake_quant as fake_quant
from compressor.backends.fine_tuning import lr_at, peak_lr
from compressor.backends.llm.model import QuantizedLinear
from compressor.core.memory import TreeRssSampler, rss_of
from compressor.errors import DataError

SAMPLE_S = 0.01      # the peak-RSS sampler's interval while training
SCALE_LR_FRACTION = 0.01
MIN_WINDOWS = 8


def train(loaded: Any, start: dict[str, QuantizedLinear], windows: np.ndarray, scheme: Any,
          progress: Any) -> tuple[dict[str, QuantizedLinear], dict]:
    """(the trained integers by parameter name, the training facts for report.json)."""
    config = scheme.training
    if len(windows) < MIN_WINDOWS:
        raise DataError(f"int4 QAT needs at least {MIN_WINDOWS} training windows, the text gave "
                        f"{len(windows)}; give a longer --data text")
    bf16 = config.precision == "bf16"
    teacher = loaded.model
    student = copy.deepcopy(teacher).to(torch.float32).train()
    if bf16:
        teacher = copy.deepcopy(teacher).to(torch.bfloat16)
    teacher.eval()
    attached = fake_quant.attach(student, start, scheme.learn_scales)
    optimizer = _optimizer(config, student, attached)
    batch = min(config.batch_size, len(windows))
    steps = max(1, config.epochs * (len(windows) // batch))
    order = np.random.default_rng(0)
    sampler = TreeRssSampler(os.getpid(), SAMPLE_S)
    before = rss_of(os.getpid())
    sampler.start()
    losses, started, tokens = [], time.perf_counter(), 0
    try:
        with progress.task(f"int4 QAT ({config.precision})", steps) as advance:
            for step in range(steps):
                if step % (len(windows) // batch) == 0:
                    permutation = order.permutation(len(windows))
                first = (step % (len(windows) // batch)) * batch
                ids = torch.as_tensor(windows[permutation[first:first + batch]])
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step, steps, config) * group["scale"]
                loss = _step(student, teacher, ids, scheme, bf16)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
                tokens += ids.numel()
                rate = tokens / (time.perf_counter() - started)
                advance(1, f"loss {np.mean(losses[-10:]):.4f}, {rate:,.0f} tokens/s")
    finally:
        sampler.stop()
        sampler.join()
    seconds = time.perf_counter() - started
    trained = fake_quant.detach(student, attached)
    del student, optimizer
    return trained, {"steps": steps, "batch_windows": batch, "tokens": tokens,
                     "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
                     "precision": config.precision, "lr": peak_lr(config),
                     "loss_first": round(float(np.mean(losses[:5])), 6),
                     "loss_last": round(float(np.mean(losses[-5:])), 6),
                     "peak_rss_bytes": sampler.peak,
                     "peak_rss_increase_bytes": max(sampler.peak - before, 0)}


def _step(student: Any, teacher: Any, ids: torch.Tensor, scheme: Any, bf16: bool) -> torch.Tensor:
    """One batch's loss: KL(teacher || student) per token at the temperature (x T^2, as
    distillation scales it), plus hard_weight x the next-token cross-entropy."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        target = teacher(input_ids=ids, use_cache=False).logits[:, :-1]
    with autocast:
        logits = student(input_ids=ids, use_cache=False).logits[:, :-1]
    t = scheme.temperature
    vocab = logits.shape[-1]
    log_student = torch.log_softmax(logits.float().reshape(-1, vocab) / t, dim=-1)
    log_teacher = torch.log_softmax(target.float().reshape(-1, vocab) / t, dim=-1)
    loss = torch.nn.functional.kl_div(log_student, log_teacher, log_target=True,
                                      reduction="batchmean") * t * t
    if scheme.hard_weight:
        hard = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                 ids[:, 1:].reshape(-1))
        loss = (1 - scheme.hard_weight) * loss + scheme.hard_weight * hard
    return loss


def _optimizer(config: Any, student: Any, attached: dict) -> torch.optim.Optimizer:
    """The recipe's optimizer; the group scales (learn_scales) at SCALE_LR_FRACTION of the
    rate: Adam moves every parameter by about the rate per step, which is a percent of a
    scale but a small share of a weight's rounding step."""
    scales = {id(f.scales) for f in attached.values() if f.scales.requires_grad}
    trainable = [p for p in student.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in scales], "scale": 1.0},
              {"params": [p for p in trainable if id(p) in scales], "scale": SCALE_LR_FRACTION}]
    groups = [g for g in groups if g["params"]]
    lr = peak_lr(config)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=1e-4)
    return torch.optim.Adam(groups, lr=lr)
