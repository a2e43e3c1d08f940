"""The hook through which shapes.py counts what its own tables cannot: a family registered with
`layout="counted"` (mixtures of experts, tensor names other than the standard q/k/v/o +
gate/up/down), or a model_type no family entry describes but transformers ships as a causal LM.

Counting those means building transformers' own model on the meta device, and decoders/ sits
below the packages that may import a framework: the counter lives in
compressor/backends/llm/meta_shapes.py and is installed here by plan/ (above backends) when
it is imported (`compress plan`, the language-model task's checks before loading). Without
one installed such a config is refused as before. Pure Python.

A counter has two methods:

- `knows(config: dict) -> bool`: transformers builds this config.json as a causal LM;
- `count(config: dict) -> (numbers, inventory)`: `numbers` are config.json keys as the
  transformers config class resolves them (defaults filled, attribute_map applied: GPT-2's
  n_embd is hidden_size), `inventory` every parameter as a shapes.TensorSpec.
"""
from __future__ import annotations

from typing import Any

_COUNTER: list[Any] = [None]


def set_counter(counter: Any) -> Any:
    """Install `counter` (None: remove it); returns the one it replaces."""
    previous, _COUNTER[0] = _COUNTER[0], counter
    return previous


def counter() -> Any:
    """The installed counter, or None."""
    return _COUNTER[0]
