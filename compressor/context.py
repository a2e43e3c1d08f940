"""What passes and backends work with: the data (Data), the run (Context), and the model state
the passes hand to each other (ModelState).

Configs are immutable; everything that changes during a run lives in ModelState, which passes
return anew. ModelState names no individual pass: it records the steps applied so far, and
code asks it for the last step of a type (`state.last(QuantizeConfig)`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from compressor.steps import StepConfig
from compressor.tensors import Arrays, TensorSpec

if TYPE_CHECKING:
    from compressor.progress import Progress
    from compressor.steps import ValidateConfig

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


class ReportSection(Protocol):
    """Something a step found that report.json records under `key` (e.g. the int8 fallback
    search), completed with facts read back from the finished artifacts."""

    key: str

    def report(self, artifacts: Mapping[str, Path]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ModelState:
    """The model as the passes leave it, and what export must still know about it.

    `steps` are the recipe steps applied so far, in order: a ptq quantize step there means
    export calibrates, a precision step asks for float16, a distill step keeps the teacher's
    loss in later fine-tuning. `float_layers` names layers that int8 quantization and export
    keep in float (quantize fallback); `sections` go into report.json.
    """

    model: Any
    steps: tuple[StepConfig, ...] = ()
    float_layers: tuple[str, ...] = ()
    sections: tuple[ReportSection, ...] = ()

    def last(self, kind: type[S]) -> S | None:
        """The most recent applied step of this config type, or None."""
        return next((step for step in reversed(self.steps) if isinstance(step, kind)), None)

    def replace(self, **changes: Any) -> ModelState:
        return dataclasses.replace(self, **changes)

    def after(self, step: StepConfig) -> ModelState:
        """This state with `step` recorded as applied."""
        return self.replace(steps=(*self.steps, step))

    def with_section(self, section: ReportSection) -> ModelState:
        kept = tuple(s for s in self.sections if s.key != section.key)
        return self.replace(sections=(*kept, section))


@dataclass
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
    training_history: list[Any] = field(default_factory=list)   # fine_tuning.TrainingHistory
