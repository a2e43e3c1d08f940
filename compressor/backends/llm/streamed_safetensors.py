"""Write a .safetensors file one tensor at a time.

safetensors' own save_file takes every tensor at once: for the checkpoints the exporters
write (a GPTQ folder for the onnxruntime-genai builder, a float32 folder for litert-torch)
that is a whole second copy of the model in memory. Here the header is written from each
tensor's dtype and shape, then each tensor is made (`make()`), written and dropped, so memory
holds one tensor beyond what the caller already has. The layout is safetensors' own: an 8-byte
little-endian header length, the JSON header (padded with spaces to 8 bytes), the tensors'
bytes back to back in the header's order.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


@dataclass(frozen=True)
class Lazy:
    """A tensor to write: its name, dtype and shape now, its values when `make()` is called."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    make: Callable[[], Any]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= int(size)
        return count * torch.empty((), dtype=self.dtype).element_size()


def lazy(name: str, tensor: Any) -> Lazy:
    """A tensor already in memory (numpy arrays are taken as torch tensors)."""
    value = torch.from_numpy(tensor) if not isinstance(tensor, torch.Tensor) else tensor
    return Lazy(name, value.dtype, tuple(value.shape), lambda: value)


def save_streamed(tensors: Sequence[Lazy], path: Path, metadata: dict[str, str] | None = None
                  ) -> None:
    if sys.byteorder != "little":   # the file is little-endian; the bytes are written as held
        raise RuntimeError("writing .safetensors needs a little-endian machine")
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for item in tensors:
        header[item.name] = {"dtype": DTYPES[item.dtype], "shape": list(item.shape),
                             "data_offsets": [offset, offset + item.nbytes]}
        offset += item.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as sink:
        sink.write(len(text).to_bytes(8, "little"))
        sink.write(text)
        for item in tensors:
            value = item.make().detach()
            if value.dtype != item.dtype or tuple(value.shape) != item.shape:
                raise ValueError(f"{item.name}: made {value.dtype} {tuple(value.shape)}, the "
                                 f"header says {item.dtype} {item.shape}")
            sink.write(memoryview(value.contiguous().reshape(-1).view(torch.uint8).numpy()))
