"""SavedModels without Keras metadata (`tf.saved_model.save`): a small digits CNN trained
here, compressed to int8 TFLite (converter from the SavedModel) and int8 ONNX (tf2onnx,
then onnxruntime's static quantization); training recipes refused by the CLI."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from compressor.backends import UserLoopBackend, backend_for
from compressor.tasks.array.data import digits
from compressor.runtimes import inspect_artifact


def folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def data():
    return digits("NHWC")


@pytest.fixture(scope="module")
def keras_model(data):
    from support.keras_models import digits_cnn, train

    return train(digits_cnn(), data, epochs=3)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, keras_model) -> Path:
    from compressor.backends.keras.env import import_tensorflow

    folder = tmp_path_factory.mktemp("saved-model") / "digits"
    import_tensorflow().saved_model.save(keras_model, str(folder))
    assert not (folder / "keras_metadata.pb").exists()
    return folder


@pytest.mark.slow
def test_the_signature_is_the_model(saved_model, keras_model, data):
    backend = backend_for(str(saved_model))
    assert backend.name == "saved_model" and not isinstance(backend, UserLoopBackend)
    model = backend.load(str(saved_model))
    info = backend.describe(model)
    assert [(s.shape, s.dtype) for s in info.inputs] == [((None, 8, 8, 1), "float32")]
    assert info.params == keras_model.count_params() and backend.image_layout == "NHWC"
    x = data.val[0][:50]
    np.testing.assert_allclose(backend.predict(model, x, batch_size=16),
                               keras_model.predict(x, verbose=0), atol=1e-5)


@pytest.mark.slow
def test_int8_gives_int8_tflite_and_onnx_within_the_gate(saved_model, tmp_path):
    """In this process (TensorFlow is loaded already); the CLI path is the refusal below."""
    import compressor as cz

    before = folder_hash(saved_model)
    result = cz.compress(str(saved_model), "int8", "digits", out_dir=tmp_path / "out",
                         quiet=True, latency=False)
    assert result.exit_code == 0, result.report["failures"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["framework"] == "saved_model" and report["baseline"]["value"] >= 0.9
    assert [row["path"] for row in report["artifacts"]] == ["model.tflite", "model.onnx"]
    for row in report["artifacts"]:
        assert row["drop"] <= 0.01, row
    for path in result.artifacts.values():
        info = inspect_artifact(path)
        assert info.weight_dtypes.get("int8", 0) >= 0.95, (path, info.weight_dtypes)
        assert [i["dtype"] for i in info.inputs] == ["float32"]
    assert folder_hash(saved_model) == before


def test_int8_qat_is_refused_before_loading_naming_the_step(cli, tmp_path):
    folder = tmp_path / "exported"            # refused before TensorFlow reads the folder
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"")
    done = cli("--recipe", "int8_qat", str(folder), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "saved_model backend does not train: step 1 `quantize` (mode qat)" in errors[0]
