"""The ggml tensor types of a .gguf file as load_gguf treats them, and the notes it leaves.

Every type the `gguf` package dequantizes in Python loads (transformers reads each tensor with
gguf.quants.dequantize, one at a time, and casts it to the model's dtype): F32, F16, BF16,
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K .. Q6_K (llama.cpp's Q*_K_S / Q*_K_M
downloads), the IQ* and TQ* types, MXFP4. Which of them a recipe keeps:
- Q4_0 is a recipe's own grid (int4, group 32, symmetric: scale d, zero point 8): kept
  exactly (gguf.py file_grids).
- Q4_1 is 4 bits in groups of 32 with a float zero point -m / d: left to the recipe by default,
  kept with rounded zero points on request (gguf.py, gguf_blocks.q41_on_int_grid).
- No recipe writes any other grid: Q8_0 is symmetric int8 in groups of 32 (the int8 recipe's
  groups are 128 wide, with zero points), Q5_0 / Q5_1 are 5-bit, Q4_K / Q5_K have float mins
  per sub-block of 32 (as Q4_1) under a 6-bit scale code, Q6_K is 6-bit in groups of 16, Q2_K
  / Q3_K are 2- and 3-bit. Those weights are dequantized (exactly, in the model's float type
  when it holds them: float16 for every type but BF16) and an integer recipe quantizes them
  again from those values; a float recipe keeps the dequantized values.
Types gguf has no dequantizer for (Q8_1, Q8_K, Q1_0, the integer and F64 types) are refused in
one line before anything is loaded.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from compressor.errors import ModelLoadError

F32, F16, BF16, Q4_0, Q4_1 = 0, 1, 30, 2, 3   # ggml type ids
FLOATS = (F32, F16, BF16)
SUPPORTED = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K"


def type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(int(ggml_type)).name
    except ValueError:
        return f"type {int(ggml_type)}"


def readable(ggml_type: int) -> bool:
    """Whether gguf.quants.dequantize reads `ggml_type` (tried on one all-zero block)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants
    from gguf.constants import GGML_QUANT_SIZES

    qtype = GGMLQuantizationType(int(ggml_type))
    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def refuse_unreadable(reader: Any, path: Path) -> None:
    """One ModelLoadError line naming the first tensor type no Python dequantizer reads."""
    seen: dict[int, list[str]] = {}
    for tensor in reader.tensors:
        seen.setdefault(int(tensor.tensor_type), []).append(tensor.name)
    for ggml_type, names in seen.items():
        if not readable(ggml_type):
            raise ModelLoadError(
                f"{path}: {len(names)} tensors ({names[0]}{', ...' if len(names) > 1 else ''}) "
                f"are stored as {type_name(ggml_type)}, which no Python dequantizer reads "
                f"(gguf {_gguf_version()}); give a file in {SUPPORTED}")


def unknown_type(exc: Exception, path: Path) -> ModelLoadError | None:
    """The refusal for a tensor type id the gguf package does not know (GGUFReader's
    ValueError "np.uint32(N) is not a valid GGMLQuantizationType"), or None for another error."""
    import re

    found = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(exc))
    if found is None:
        return None
    return ModelLoadError(f"{path} holds tensors of ggml type id {found.group(1)}, which the "
                          f"gguf package {_gguf_version()} does not know; give a file in "
                          f"{SUPPORTED}, or upgrade gguf if a newer one reads that type")


def _gguf_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "?"


class Tally:
    """What load_gguf did with each quantized weight the quantize pass would quantize."""

    def __init__(self) -> None:
        self.kept: Counter[int] = Counter()          # Q4_0 (exact), Q4_1 (zero points rounded)
        self.dequantized: Counter[int] = Counter()   # ggml type -> weights dequantized only
        self.dropped: list[str] = []                 # blocks that did not match the weight

    def notes(self) -> tuple[str, ...]:
        notes = []
        if self.kept[Q4_0]:
            notes.append(f"gguf: {self.kept[Q4_0]} Q4_0 weights kept on the file's own grid "
                         "(exact)")
        if self.kept[Q4_1]:
            notes.append(f"gguf: {self.kept[Q4_1]} Q4_1 weights kept with their zero points "
                         "rounded to integers")
        for ggml_type in sorted(self.dequantized):
            count = self.dequantized[ggml_type]
            if ggml_type == Q4_1:
                notes.append(f"gguf: {count} Q4_1 weights left to the recipe (zero points -m/d "
                             "are not integers): quantized again from the file's values")
            else:
                notes.append(f"gguf: {count} {type_name(ggml_type)} weights dequantized (no "
                             "recipe writes that grid: an integer recipe quantizes them again)")
        if self.dropped:
            notes.append(f"gguf: {len(self.dropped)} 4-bit tensors did not match the loaded "
                         f"weights and are quantized again ({', '.join(self.dropped[:3])})")
        return tuple(notes)
