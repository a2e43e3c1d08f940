"""int4 quantization-aware training for a language model (`int4_qat`: scheme Int4Qat).

From the `int4` integers (the candidate search's winner: GPTQ / clip search, int8 mixed in), a
copy of the model is fine-tuned with every stored matrix fake-quantized on exactly its stored
grid (fake_quant.py), the original model as teacher: the loss is KL(teacher || student) of
the next-token distributions at `temperature` (plus `hard_weight` x the next-token
cross-entropy), the teacher's logits computed batch by batch, never held for the corpus. The
training windows are the recipe's calibration text (the same windows the starting integers
were chosen on, less the 1 in 16 that judge each epoch, lm_epochs.py: the best epoch is kept;
the held-out windows validate). Norms and biases train too and are exported with the integers
(they are stored in float). At the end the trained integers are read from the same computation
as the forward, so the artifacts store what was trained, rounded nowhere else. When an exported
format rounds the matrices' inputs at run time (a .tflite: int8 per token), the student's
inputs are rounded so in training too, straight through (dynamic_int8.py).

`precision: bf16`: the forward and backward in bfloat16 (master_weights.py: every weight read
as bfloat16, fake-quantized ones straight from FakeQuant), the teacher held in bfloat16; the
student's latent weights and Adam's state stay float32 (master copies), so the integers are
chosen from float32 latent weights. report.json `training` records seconds, tokens/s,
the training's peak RSS and the loss, so fp32 and bf16 runs compare side by side. The loop
and the loss are the ones width pruning and distillation use too (lm_train.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import torch

import compressor.backends.llm.fake_quant as fake_quant
import compressor.backends.llm.lm_train as lm_train
from compressor.backends.llm.candidates import input_rounding
from compressor.backends.fine_tuning import TrainingHistory
from compressor.backends.llm.model import LoadedLm, QuantizedLinear

# the group scales' share of the rate. At 1/100 (lr 5e-4: 5e-6 a step) SmolLM2-135M's scales
# (median 0.053) moved 0.01% a step, frozen in effect; 1/10 measured closer on all three models
# tried (held-out perplexity increase, torch, the same start: tests' tiny Llama 0.62 -> 0.54x
# int4's, bench Llama -0.11 -> -0.17x, SmolLM2 0.55 -> 0.52x); 2/10 and 3/10 undid the tiny
# Llama (1.13x, 1.39x)
SCALE_LR_FRACTION = 0.1


def train(loaded: LoadedLm, start: dict[str, QuantizedLinear], windows: np.ndarray,
          scheme: Any, progress: Any, formats: tuple[str, ...] = (),
          history: TrainingHistory | None = None) -> tuple[LoadedLm, dict]:
    """(the trained model: its trained integers in `quantized`, its norms and biases trained
    with them; the training facts for report.json). `history` records the epochs."""
    config = scheme.training
    lm_train.check_windows(windows, "int4 QAT")
    bf16 = config.precision == "bf16"
    student = lm_train.float32_student(loaded.model)
    teacher = lm_train.frozen_teacher(loaded.model, bf16)
    rounding, rounded_as = _input_rounding(student, start, formats)
    attached = fake_quant.attach(student, start, scheme.learn_scales)
    optimizer = lm_train.optimizer_for(config, _groups(student, attached))

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        return lm_train.distillation_loss(student, teacher, ids, scheme.temperature,
                                          scheme.hard_weight, bf16)

    with rounding:
        facts = lm_train.train_windows(windows, config, student, loss_of, optimizer, progress,
                                       "int4 QAT", history)
    trained = fake_quant.detach(student, attached)
    # the student's float matrices are the latent ones, which no artifact reads (`quantized`
    # overrides them); its norms were trained with the integers and are exported with them
    model = lm_train.in_dtype_of(student, loaded.model)
    return dataclasses.replace(loaded, model=model, quantized=trained, owned=False), \
        {**facts, "inputs_rounded_as": rounded_as}


def _input_rounding(student: Any, start: dict[str, QuantizedLinear], formats: tuple[str, ...]
                    ) -> tuple[Any, str | None]:
    """(a context in which the student's quantized matrices see their inputs rounded as the
    first exported format that rounds them at run time does (Format.lm_activations: a
    .tflite's int8 per token), straight through; that format). Made before the fake
    quantization is attached: the modules are found by their weights."""
    for fmt in formats:
        rounding = input_rounding(fmt)
        if rounding is not None:
            return rounding(student, start, straight_through=True), fmt
    return contextlib.nullcontext(), None


def _groups(student: Any, attached: dict) -> list[dict]:
    """The parameter groups; the group scales (learn_scales) at SCALE_LR_FRACTION of the
    rate: Adam moves every parameter by about the rate per step, which is a large share of a
    small scale (the tests' tiny Llama's 0.017: 3% a step at the full rate) but a small share
    of a weight's rounding step."""
    scales = {id(f.scales) for f in attached.values() if f.scales.requires_grad}
    trainable = [p for p in student.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if id(p) not in scales], "scale": 1.0},
            {"params": [p for p in trainable if id(p) in scales], "scale": SCALE_LR_FRACTION}]
