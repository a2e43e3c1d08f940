"""One trained digits model per backend, saved the way a user would hand it to `compress`.

`saved_digits_model(backend, folder)` returns (model reference, extra CLI args): a `.keras`
file for Keras; `compressor.backends.examples:torch_digits_cnn` + `--weights` for PyTorch.
"""
from __future__ import annotations

from pathlib import Path

BACKENDS = ("keras", "torch")
TORCH_BUILDER = "compressor.backends.examples:torch_digits_cnn"


def saved_digits_model(backend: str, folder: Path, epochs: int = 8) -> tuple[str, dict]:
    from compressor.backends import examples

    if backend == "keras":
        path = folder / "digits.keras"
        examples.train_keras_digits_cnn(epochs=epochs).save(path)
        return str(path), {}
    import torch

    weights = folder / "digits_state.pt"
    torch.save(examples.train_torch_digits_cnn(epochs=epochs).state_dict(), weights)
    return TORCH_BUILDER, {"weights": str(weights)}


def cli_args(options: dict) -> list[str]:
    return [part for key, value in options.items() for part in (f"--{key}", value)]
