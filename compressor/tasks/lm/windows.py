"""A language model's data: text cut into token windows with its own tokenizer."""
from __future__ import annotations

from typing import Any

from compressor.backends.llm.model import LoadedLm
from compressor.core.context import Data
from compressor.errors import DataError


def text_windows(model: LoadedLm, data: Any, windows: dict[str, int | None],
                 progress: Any = None) -> Data:
    """Data(train=(calibration windows, None), val=(held-out windows, None)): token ids
    [n, T] int64; the next tokens are the labels, so there are none besides. A short text
    gives fewer windows than asked for: one `warning:` line on `progress` says how many."""
    from compressor.tasks.lm.text_data import resolve_text_data

    if data == "digits":   # the classifier default: a language model's is the built-in text
        data = "text"
    text = resolve_text_data(data, **windows)
    if model.tokenizer is None:
        raise DataError("the model came without a tokenizer; save it beside the model "
                        "(tokenizer.save_pretrained) or return (model, tokenizer) from "
                        "module:function")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and text.window > limit:
        raise DataError(f"windows of {text.window} tokens are longer than the model's "
                        f"{limit}-token context; set the recipe's validate.window <= {limit}")
    calibration, evaluation = text.windows(model.tokenizer)
    note = text.short_note(calibration, evaluation)
    if note and progress is not None:
        progress.info(note)
    vocab = model.config.vocab_size
    if max(calibration.max(), evaluation.max()) >= vocab:
        raise DataError(f"the tokenizer gives token ids up to {max(calibration.max(), evaluation.max())}"
                        f" but the model's vocabulary has {vocab}; use the model's own tokenizer")
    return Data(train=(calibration, None), val=(evaluation, None), name=text.name)
