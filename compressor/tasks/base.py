"""What a task is: the one place that knows what a model is for.

A task owns the data preparation and reference outputs of a session (`open`), the metric and
the gate's budget, the evaluation of an artifact in its runtime (`evaluate`), the keys it adds
to report.json, and its rows and sections in report.md / report.html / the terminal summary /
sweep frames (`ReportView`). The model kind picks the task (`Backend.task`); a report names it
(report.json `task`), so re-rendering a report needs no model.

Nothing outside compressor/tasks asks which task a run is: it calls the task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from compressor.config.recipe import Recipe
    from compressor.core.context import Context, ModelState
    from compressor.devices import DeviceProfile


@dataclass(frozen=True)
class OpenRequest:
    """A session's inputs as the caller gave them (run/session.py fills it): what a task reads
    to prepare its data, reference and gate."""

    model_ref: Any                   # the path / reference / object the user passed
    recipe: Recipe
    data: Any                        # the data spec, as given
    formats: tuple[str, ...]
    seed: int = 0
    formats_asked: bool = False      # the formats came from --format / formats=, not the recipe
    quiet: bool = False
    target: str | None = None
    metric: Any = None               # a custom metric function (array task only)
    context: int | None = None       # --context: the KV-cache length (language models)
    devices: int | None = None       # --devices: split the LM's ONNX artifact into K stages
    force_plan: bool = False
    teacher: Any = None
    teacher_weights: str | None = None
    trust_pickle: bool = False
    notes: tuple[str, ...] = field(default=())   # lines to show once the session is open


@dataclass(frozen=True)
class Opened:
    """What a task's `open` hands back to the session."""

    info: Any                               # backends.base.ModelInfo of the original model
    ctx: Context
    teacher_entry: dict[str, Any] | None = None   # report.json `teacher`


class ReportView(Protocol):
    """A task's part of every rendering of a report (report.json's dict in, text out)."""

    sweep_columns: tuple[str, ...]          # artifact keys a sweep frame adds for this task
    metric_lower_is_better: bool            # a Pareto front minimises metric_value (perplexity)

    def markdown_lines(self, report: dict[str, Any]) -> list[str]:
        """report.md lines of the task's own table, placed before the artifact table."""

    def summary(self, report: dict[str, Any]) -> tuple[str, tuple[str, ...], list[list[str]]]:
        """The terminal table: its title, column names and rows."""

    def metric_section(self, report: dict[str, Any]) -> str:
        """report.html's section of the task's metric against the gate ("" when none)."""


class Task(ReportView, Protocol):
    name: ClassVar[str]                     # report.json `task`

    def before_load(self, request: OpenRequest) -> dict[str, Any] | None:
        """Checks that need no loaded model (a language model's plan against the target):
        report.json `plan`, or None."""

    def open(self, request: OpenRequest, backend: Any, model: Any) -> Opened:
        """Data, reference outputs and baseline of the loaded `model`: the run's Context."""

    def evaluate(self, session: Any, state: ModelState, path: Path) -> dict[str, Any]:
        """One artifact's report row, measured in its own runtime."""

    def budget_bytes(self, profile: DeviceProfile) -> int:
        """How much of the device's memory this task's artifact may use."""

    def add_report_keys(self, report: dict[str, Any], session: Any) -> None:
        """Set this task's keys in report.json's dict (over the common ones)."""


_TASKS: dict[str, Task] = {}


def register_task(task_class: type) -> type:
    """Make `task_class` the task named `task_class.name` (a decorator)."""
    if task_class.name in _TASKS:
        raise RuntimeError(f"task {task_class.name!r} registered twice")   # a programming error
    _TASKS[task_class.name] = task_class()
    return task_class


def task_named(name: str) -> Task:
    from compressor.errors import CompressorError

    if name not in _TASKS:
        raise CompressorError(f"no task named {name!r}; the tasks are {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def registered_tasks() -> list[str]:
    return sorted(_TASKS)


def task_of_report(report: dict[str, Any]) -> Task:
    """The task a report.json was written by; reports from before report.json named it are
    told apart by what only a language model's baseline has."""
    name = report.get("task") or ("lm" if "perplexity" in report.get("baseline", {}) else "array")
    return task_named(name)


def describe_ref(model: Any) -> str:
    """How report.json names a model: its path or reference as given, else its class (a
    (model, tokenizer) pair's model's)."""
    if isinstance(model, tuple) and len(model) == 2:
        model = model[0]
    return str(model) if isinstance(model, (str, Path)) else type(model).__qualname__
