"""What passes and backends work with: the data (Data), the run (Context), and the model state
the passes hand to each other (ModelState).

Configs are immutable; the model as it changes lives in ModelState, which passes return anew,
and what a run measures goes to the append-only RunRecord (`ctx.record`) that only the report
reads. ModelState names no individual pass: it records the steps applied so far (training
code asks for the last step of a type, `state.last(DistillConfig)`), and the scheme the
artifact is written in, which is all an exporter reads.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from compressor.core.record import RunRecord
from compressor.schemes.base import Scheme
from compressor.schemes.builtin import FLOAT32
from compressor.config.steps import StepConfig
from compressor.core.tensors import Arrays, TensorSpec

if TYPE_CHECKING:
    from compressor.core.progress import Progress
    from compressor.config.steps import ValidateConfig

Split = tuple["Arrays", "np.ndarray | None"]
S = TypeVar("S", bound=StepConfig)


@dataclass(frozen=True)
class Data:
    """Train and validation splits as numpy arrays; labels may be None (fidelity metric).

    `cz.Data(train=(x, y), val=(xv, yv))`; for a model with several inputs x is a dict
    name -> array. `train` is needed by fine-tuning and calibration, `val` by validation.
    """

    train: Split | None = None
    val: Split | None = None
    name: str = "data"

    @property
    def has_labels(self) -> bool:
        return self.val is not None and self.val[1] is not None


@dataclass(frozen=True)
class ModelState:
    """The model as the passes leave it, and what export must still know about it.

    `steps` are the recipe steps applied so far, in order (a distill step keeps the teacher's
    loss in later fine-tuning; the order rules read them). `scheme` is how the artifact stores
    its weights (set by the quantize / precision pass): the export handlers registered for it
    write the file. `float_layers` names layers that int8 quantization and export keep in
    float (quantize fallback).
    """

    model: Any
    steps: tuple[StepConfig, ...] = ()
    float_layers: tuple[str, ...] = ()
    scheme: Scheme = FLOAT32

    def last(self, kind: type[S]) -> S | None:
        """The most recent applied step of this config type, or None."""
        return next((step for step in reversed(self.steps) if isinstance(step, kind)), None)

    def replace(self, **changes: Any) -> ModelState:
        return dataclasses.replace(self, **changes)

    def after(self, step: StepConfig) -> ModelState:
        """This state with `step` recorded as applied."""
        return self.replace(steps=(*self.steps, step))



@dataclass(frozen=True)
class Context:
    """Everything a pass or a backend may touch besides the model: no globals, so sweeps can
    fan out. The accuracy-gate fields are set by a pipeline run (None outside one) for
    searches that measure candidates at step time (quantize fallback: auto)."""

    data: Data
    progress: Progress
    workdir: Path
    seed: int = 0
    teacher: Any = None
    formats: tuple[str, ...] = ()             # export formats, first = the one searches measure
    validation: ValidateConfig | None = None
    metric: Any = None                        # a custom metric function overriding validation's
    reference_outputs: Arrays | None = None   # the original model's outputs on data.val
    baseline_value: float | None = None       # the original model's metric on data.val
    inputs: tuple[TensorSpec, ...] = ()       # the original model's named inputs, in its order
    outputs: tuple[TensorSpec, ...] = ()      # ... and outputs: exporters keep these names
    output_index: int = 0                     # the output the metric and training losses read
    context: int | None = None                # language models: the KV-cache length artifacts get
    plan: dict | None = None                  # ... and the plan made before any work (--target)
    record: RunRecord = field(default_factory=RunRecord)   # what the run measures (append-only)
