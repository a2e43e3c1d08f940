"""An artifact format added from outside the package by registration alone: `.toy` files (a
JSON list of weights), with the runtime, inspector, language-model runtime, quick check,
float-kernel reader and export handler defined here. Every place that lists, checks or
dispatches on formats reads the format registry, so the toy format shows up in each; nothing
in compressor/ names it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from compressor.backends.base import SchemeExporter
from compressor.cli import main
from compressor.config.recipe import recipe_from_dict
from compressor.core.context import ModelState
from compressor.errors import ModelLoadError, RecipeError
from compressor.formats import (FORMAT_RUNTIMES, Format, default_formats, format_names,
                                format_of, register_format, unregister_format)
from compressor.runtimes.base import ArtifactInfo, WeightTensor
from compressor.schemes import Float32, export_handler, formats_of

KIND = "toy_kind"   # a model kind that writes onnx and toy files (handlers below)
TOY = Format(name="toy", runtime="toyrt", open=f"{__name__}:ToyRuntime",
             inspect=f"{__name__}:inspect_toy", open_lm=f"{__name__}:ToyLm",
             lm_hint="a .toy file", check=f"{__name__}:check_toy",
             float_kernels=f"{__name__}:toy_float_kernels")


class ToyRuntime:
    name = "toyrt 1.0"

    def __init__(self, path: Path, threads: int | None = None):
        self.weights = np.array(json.loads(Path(path).read_text()), np.float32)
        self.threads = threads or 1

    def predict(self, x: np.ndarray, batch_size: int = 64) -> np.ndarray:
        return x @ self.weights[:, None]


class ToyLm(ToyRuntime):
    context = 8


def inspect_toy(path: Path, sample_shapes=None) -> ArtifactInfo:
    weights = json.loads(Path(path).read_text())
    tensor = WeightTensor("w", "float32", (len(weights),), weights.count(0), is_kernel=True)
    return ArtifactInfo(format="toy", path=Path(path), size_bytes=Path(path).stat().st_size,
                        gzip_bytes=0, sha256="", params=len(weights),
                        weight_dtypes={"float32": 1.0}, sparsity=0.0, ops={"Dense": 1},
                        inputs=[], outputs=[], est_peak_memory_bytes=16, weights=(tensor,))


def check_toy(path: Path) -> None:
    if not Path(path).read_text().startswith("["):
        raise ModelLoadError(f"{path}: not a toy file")


def toy_float_kernels(path: Path) -> list[str]:
    return ["Dense (w)"]


@export_handler(Float32, KIND, "toy", made_by="json.dumps")
def _write_toy(backend, state, scheme, path, ctx):
    path.write_text(json.dumps(state.model))
    return path


@export_handler(Float32, KIND, "onnx", made_by="not called")
def _write_onnx(backend, state, scheme, path, ctx):
    raise AssertionError("not called")


class ToyExporter(SchemeExporter):
    name = KIND


@pytest.fixture
def toy():
    register_format(TOY)
    yield TOY
    unregister_format(TOY.name)


@pytest.fixture
def written(toy, tmp_path) -> Path:
    return ToyExporter().export(ModelState(model=[1.0, 0.0, 2.0]), "toy", tmp_path / "m.toy", None)


def test_the_format_list_is_the_registry(toy):
    from compressor.export import FORMATS

    assert format_names() == ("tflite", "onnx", "gguf", "toy") and list(FORMATS) == list(format_names())
    assert "toy" in FORMATS and default_formats() == ("tflite", "onnx")   # not exported unasked
    assert formats_of(KIND) == ("onnx", "toy")                            # the house order
    assert recipe_from_dict({"name": "x", "export": ["toy"]}).export == ("toy",)
    with pytest.raises(RecipeError, match="Input should be 'tflite', 'onnx', 'gguf' or 'toy'"):
        recipe_from_dict({"name": "x", "export": ["pt"]})
    assert FORMAT_RUNTIMES["toy"] == "toyrt" and dict(FORMAT_RUNTIMES)["onnx"] == "onnxruntime"


def test_export_open_inspect_and_check_read_the_registry(written):
    from compressor.export.int8 import float_kernels
    from compressor.runtimes import inspect_artifact, open_runtime
    from compressor.runtimes.lm import open_lm_runtime

    assert format_of(written) == "toy"
    runtime = open_runtime(written, threads=2)
    assert isinstance(runtime, ToyRuntime) and runtime.threads == 2
    np.testing.assert_allclose(runtime.predict(np.eye(3, dtype=np.float32)), [[1], [0], [2]])
    info = inspect_artifact(written)
    assert info.format == "toy" and info.params == 3 and info.weights[0].zeros == 1
    assert isinstance(open_lm_runtime(written), ToyLm)
    assert float_kernels(written) == ["Dense (w)"]


def test_the_cli_and_devices_read_the_registry(written, tmp_path, capsys):
    from compressor.devices import get_profile

    assert main(["inspect", str(written), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "toy"
    assert main(["inspect", str(tmp_path / "missing.toy")]) == 2
    assert "give the path of a .tflite or .onnx or .gguf or .toy file" in capsys.readouterr().err
    written.write_text("{}")
    assert main(["inspect", str(written)]) == 2                # the format's own check ran
    assert "not a toy file" in capsys.readouterr().err
    board = tmp_path / "board.yaml"
    board.write_text(yaml.safe_dump({"name": "board", "memory_bytes": "1GB", "model_share": 0.5}))
    assert get_profile(board).runs("toy")                      # a profile's default: every runtime


def test_a_session_lists_it(toy):
    from compressor.run.session import open_session

    with pytest.raises(RecipeError, match="unknown export format pt; use tflite and/or onnx "
                                          "and/or gguf and/or toy"):
        open_session("model.onnx", "fp16", formats=("pt",), out_dir=None)


def test_unregistered_it_is_gone_everywhere(tmp_path):
    assert format_names() == ("tflite", "onnx", "gguf") and FORMAT_RUNTIMES.get("toy") is None
    with pytest.raises(ModelLoadError, match="expected .tflite or .onnx or .gguf"):
        format_of(tmp_path / "m.toy")
    with pytest.raises(RecipeError, match="Input should be 'tflite', 'onnx' or 'gguf'"):
        recipe_from_dict({"name": "x", "export": ["toy"]})


def test_every_built_in_reference_resolves():
    from compressor.formats import registered_formats, resolve

    references = [getattr(fmt, field) for fmt in registered_formats()
                  for field in ("open", "inspect", "open_lm", "inspect_folder", "check",
                                "float_kernels") if getattr(fmt, field)]
    assert len(references) == 12 and all(callable(resolve(ref)) for ref in references)
