"""What kind of model an in-memory object is, told by class names alone (imports nothing)."""
from __future__ import annotations

from typing import Any


def is_causal_lm(model: Any) -> bool:
    """A transformers model with a generation head."""
    names = {cls.__name__ for cls in type(model).__mro__}
    return {"GenerationMixin", "PreTrainedModel"} <= names
