"""What a pass may use (Context) and the run state passes hand to each other (ModelState).

Configs are immutable; everything that changes during a run (the wrapped model, what the
export must still do) lives in ModelState, which passes return anew.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from compressor.backends.base import Backend
    from compressor.fallback import FallbackResult
    from compressor.passes.distill import DistillConfig
    from compressor.passes.precision import PrecisionConfig
    from compressor.passes.quantize import QuantizeConfig
    from compressor.progress import Progress
    from compressor.recipe import ValidateConfig

Split = tuple[np.ndarray, "np.ndarray | None"]


@dataclass(frozen=True)
class Data:
    """Train and validation splits as numpy arrays; labels may be None (fidelity metric).

    `cz.Data(train=(x, y), val=(xv, yv))`. `train` is needed by fine-tuning and calibration,
    `val` by validation.
    """

    train: Split | None = None
    val: Split | None = None
    name: str = "data"

    @property
    def has_labels(self) -> bool:
        return self.val is not None and self.val[1] is not None


@dataclass(frozen=True)
class ModelState:
    """The model as the passes leave it, plus what the exporters still have to apply.

    `quantize` set by a qat step means the model already carries fake-quant ranges; by a
    ptq step, that export must calibrate. `precision` asks export for lower-precision floats.
    `distill` stays set after a distill step so later fine-tuning keeps the teacher's loss.
    `float_layers` names layers that quantize and export keep in float (int8 fallback);
    `fallback` is what the fallback search measured, for the report.
    """

    model: Any
    quantize: QuantizeConfig | None = None
    precision: PrecisionConfig | None = None
    distill: DistillConfig | None = None
    sparsity: float = 0.0
    float_layers: tuple[str, ...] = ()
    fallback: FallbackResult | None = None

    def replace(self, **changes: Any) -> ModelState:
        return dataclasses.replace(self, **changes)


@dataclass
class Context:
    """Everything a pass may touch besides the model: no globals, so sweeps can fan out."""

    data: Data
    backend: Backend
    progress: Progress
    workdir: Path
    seed: int = 0
    teacher: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    # The accuracy gate as the pipeline will apply it, for searches that run at step time
    # (quantize fallback: auto). None outside a pipeline run.
    validation: ValidateConfig | None = None
    metric: Any = None                        # a custom metric function overriding validation's
    reference_outputs: np.ndarray | None = None   # the original model's outputs on data.val
    baseline_value: float | None = None       # the original model's metric on data.val
    formats: tuple[str, ...] = ()             # export formats, first = the one searches measure
