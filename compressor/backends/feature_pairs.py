"""What both backends share for intermediate-feature distillation (`distill.feature_pairs`):
finding the named layers, and deciding from two feature shapes whether a learned projection
is needed. Framework-neutral: names and shapes only.

Each pair adds MSE(projection(student feature), teacher feature). The projection (a 1x1 conv
or a linear map over the channel axis) exists only while the distill step trains: it maps
the student's width onto the teacher's and is dropped afterwards, so the exported model is
exactly the student.
"""
from __future__ import annotations

from collections.abc import Sequence

from compressor.errors import RecipeError

# tfmot renames the layers it wraps: prune_low_magnitude_<name> while pruning, quant_<name>
# in a QAT model. A pair names the original layer; these forms match it too.
WRAPPER_PREFIXES = ("prune_low_magnitude_", "quant_")
NAMES_SHOWN = 12


def resolve_layer(name: str, available: Sequence[str], role: str) -> str:
    """The layer of `available` that `name` means (exact, or under a tfmot wrapper prefix);
    a RecipeError naming the available layers otherwise. `role` is "student" or "teacher"."""
    if name in available:
        return name
    wrapped = [prefix + name for prefix in WRAPPER_PREFIXES if prefix + name in available]
    if wrapped:
        return wrapped[0]
    shown = ", ".join(available[:NAMES_SHOWN]) + (", ..." if len(available) > NAMES_SHOWN else "")
    raise RecipeError(f"distill feature_pairs: the {role} has no layer named {name!r}; its "
                      f"layers are: {shown or '(none with names)'}")


def resolve_pairs(pairs: Sequence[tuple[str, str]], student_layers: Sequence[str],
                  teacher_layers: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair's (student layer, teacher layer) as the models name them."""
    return [(resolve_layer(student, student_layers, "student"),
             resolve_layer(teacher, teacher_layers, "teacher")) for student, teacher in pairs]


def needs_projection(pair: tuple[str, str], student_shape: Sequence[int],
                     teacher_shape: Sequence[int], channel_axis: int) -> bool:
    """Whether the student's feature must be projected to the teacher's width (the channel
    axis differs). Other axes (batch aside) must match: a RecipeError naming both shapes."""
    student, teacher = list(student_shape), list(teacher_shape)
    rank = len(student)
    axis = channel_axis % rank if rank else 0
    same_rank = rank == len(teacher) and rank >= 2
    if not same_rank or any(s != t for i, (s, t) in enumerate(zip(student, teacher))
                            if i not in (0, axis)):
        raise RecipeError(
            f"distill feature_pairs [{pair[0]}, {pair[1]}]: the student's feature has shape "
            f"{tuple(student[1:])} and the teacher's {tuple(teacher[1:])} (batch aside); they "
            "may differ only in channels: pick layers at the same resolution")
    return student[axis] != teacher[axis]
