"""Intermediate-feature distillation for PyTorch (`distill.feature_pairs`).

Forward hooks on the named modules (`named_modules()` names) capture both models' features;
a forward pre-hook on the student runs the frozen teacher on every training batch the student
sees, so no teacher feature is stored beyond one batch. The loss gains
`feature_weight * sum MSE(projection(student), teacher)`; a projection (a linear map over the
channel axis, i.e. a 1x1 conv for NCHW features) is trained with the student when the widths
differ and is dropped with the hooks when the step ends.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from compressor.backends.feature_pairs import needs_projection, resolve_pairs
from compressor.errors import RecipeError
from compressor.config.steps import DistillConfig

if TYPE_CHECKING:
    from compressor.config.steps import TrainingConfig

CHANNEL_AXIS = 1   # NCHW / NCL features; (N, C) for linear layers
PROBE_ROWS = 2


class ChannelProjection(torch.nn.Module):
    """A linear map over the channel axis: a 1x1 conv for conv features, linear for (N, C)."""

    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.linear = torch.nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.movedim(CHANNEL_AXIS, -1)).movedim(-1, CHANNEL_AXIS)


class FeatureDistillation:
    """The hooks and projections of one distill step; `attach` adds them to a TrainingSetup,
    `close` removes every hook (the student is then exactly as it was, plus its training)."""

    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module, config: DistillConfig,
                 probe: list[torch.Tensor]):
        pairs = resolve_pairs(config.feature_pairs, _names(student), _names(teacher))
        self.weight = config.feature_weight
        self.student_features: list[torch.Tensor | None] = [None] * len(pairs)
        self.teacher_features: list[torch.Tensor | None] = [None] * len(pairs)
        student_modules, teacher_modules = dict(student.named_modules()), dict(teacher.named_modules())
        self.hooks = [student_modules[s].register_forward_hook(self._keeper(self.student_features, i))
                      for i, (s, _) in enumerate(pairs)]
        self.hooks += [teacher_modules[t].register_forward_hook(self._keeper(self.teacher_features, i))
                       for i, (_, t) in enumerate(pairs)]
        with torch.no_grad():
            student(*(t[:PROBE_ROWS] for t in probe))
            teacher(*(t[:PROBE_ROWS] for t in probe))
        _check_called(pairs, self.student_features, self.teacher_features)
        self.projections = torch.nn.ModuleList([
            ChannelProjection(s.shape[CHANNEL_AXIS], t.shape[CHANNEL_AXIS])
            if needs_projection(pair, s.shape, t.shape, CHANNEL_AXIS) else torch.nn.Identity()
            for pair, s, t in zip(pairs, self.student_features, self.teacher_features)])
        self.hooks.append(student.register_forward_pre_hook(self._run_teacher(teacher)))

    def _keeper(self, features: list, index: int):
        def keep(module, args, output):
            features[index] = output[0] if isinstance(output, (tuple, list)) else output
        return keep

    def _run_teacher(self, teacher: torch.nn.Module):
        def run(module, args):
            if module.training:   # only training batches need the teacher's features
                with torch.no_grad():
                    teacher(*args)
        return run

    def term(self) -> torch.Tensor:
        """weight * the sum over pairs of MSE(projection(student feature), teacher feature)."""
        return self.weight * sum(
            torch.nn.functional.mse_loss(projection(s), t.detach())
            for projection, s, t in zip(self.projections, self.student_features,
                                        self.teacher_features))

    def attach(self, setup: Any) -> Any:
        """The setup whose loss adds `term()` and whose optimizer also trains the projections."""
        trainable = list(self.projections.parameters())
        if trainable:
            setup.optimizer.add_param_group({"params": trainable})
        task_loss = setup.loss
        return dataclasses.replace(
            setup, loss=lambda outputs, *targets: task_loss(outputs, *targets) + self.term())

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.student_features = self.teacher_features = []


def feature_distillation(student: torch.nn.Module, config: TrainingConfig, teacher: torch.nn.Module,
                         inputs: list[torch.Tensor]) -> FeatureDistillation | None:
    """The feature terms of a distill step with feature_pairs; None for any other step."""
    if not isinstance(config, DistillConfig) or not config.feature_pairs:
        return None
    return FeatureDistillation(student, teacher, config, inputs)


def _names(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def _check_called(pairs: list[tuple[str, str]], student: list, teacher: list) -> None:
    """A module that forward() never calls (or an exported graph, whose ops no longer go
    through its modules) gives no feature: say so instead of training without the term."""
    for (student_name, teacher_name), s, t in zip(pairs, student, teacher):
        for role, name, feature in (("student", student_name, s), ("teacher", teacher_name, t)):
            if not isinstance(feature, torch.Tensor):
                raise RecipeError(
                    f"distill feature_pairs: the {role}'s module {name!r} gave no tensor in "
                    "forward() (not called, or the model is an exported graph whose modules "
                    "are not called); pick a module forward() calls, and put distill before "
                    "quantize")
