"""onnxruntime-genai folders (model-onnx/) of the tiny test LMs, built by the ONNX route's
export function once per test session and shared by every test that asks for the same one.

`genai_build(tmp_path_factory, model_dir, scheme="int4")` -> GenaiBuild(folder, loaded,
seconds): `loaded` is the LoadedLm it was written from (quantized by round to nearest, so the
torch reference of the same integers is `loaded` with `quantized_weights`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BUILT: dict[tuple, GenaiBuild] = {}


@dataclass(frozen=True)
class GenaiBuild:
    folder: Path
    loaded: Any
    seconds: float


def scheme_of(name: str, group_size: int = 32) -> Any:
    from compressor.schemes import Float16, Float32, Int4WeightOnly, Int8WeightOnly

    return {"int4": Int4WeightOnly(group_size=group_size, algorithm="rtn"),
            "int8": Int8WeightOnly(), "fp16": Float16(), "fp32": Float32()}[name]


def quantized_lm(model_dir: Path, scheme: str, group_size: int) -> Any:
    """The folder's LoadedLm, its linears (and an untied embedding) on the scheme's grid
    (int4: symmetric, int8: a zero point per group of 128), rounded to nearest."""
    import dataclasses

    from compressor.backends.llm.handlers import weight_only_plan
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import quantize_lm

    loaded = load_lm(Path(model_dir))
    plan = weight_only_plan(scheme_of(scheme, group_size), loaded)
    if plan is None:
        return loaded
    return loaded.with_quantized(quantize_lm(loaded, dataclasses.replace(plan, algorithm="rtn"), None))


def genai_build(tmp_path_factory: Any, model_dir: Path, scheme: str = "int4",
                group_size: int = 32, context: int | None = None) -> GenaiBuild:
    from compressor.backends.llm.genai import write_genai_folder
    from compressor.core.context import Context, Data, ModelState
    from compressor.core.progress import Progress

    key = (str(model_dir), scheme, group_size, context)
    if key not in _BUILT:
        loaded = quantized_lm(model_dir, scheme, group_size)
        root = tmp_path_factory.mktemp(f"genai-{Path(model_dir).name}-{scheme}")
        (root / "staging").mkdir()
        ctx = Context(data=Data(), progress=Progress(quiet=True), workdir=root / "work",
                      context=context)
        start = time.perf_counter()
        folder = write_genai_folder(ModelState(model=loaded, scheme=scheme_of(scheme, group_size)),
                                    scheme_of(scheme, group_size), root / "staging" / "model.onnx",
                                    ctx)
        _BUILT[key] = GenaiBuild(folder, loaded, time.perf_counter() - start)
    return _BUILT[key]
