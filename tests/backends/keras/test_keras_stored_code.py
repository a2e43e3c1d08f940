"""A Lambda layer stores Python code; loading one runs it. Whatever the format (.keras, .h5,
SavedModel) and however its JSON config is spelled (plain, re-spaced, `\\u004cambda`), the
code must not run without --trust-pickle. The Lambda here writes a marker file when called."""
from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from compressor.errors import ModelLoadError

pytest.importorskip("tf_keras")
SPELLINGS = ("plain", "respaced", "escaped")


def _respell(text: str, spelling: str) -> str:
    if spelling == "plain":
        return text
    if spelling == "respaced":
        return json.dumps(json.loads(text), indent=3, separators=(" ,", " :  "))
    return text.replace('"Lambda"', '"\\u004cambda"')


@pytest.fixture(scope="module")
def lambda_models(tmp_path_factory):
    """{format: saved path} of one model with a marker-writing Lambda, and the marker path."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    folder = tmp_path_factory.mktemp("lambda")
    marker = folder / "MARKER"
    inputs = keras.Input((8, 8, 1))
    touched = keras.layers.Lambda(
        lambda x, p=str(marker): (__import__("pathlib").Path(p).touch(), x)[1], name="touch")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(touched)))
    paths = {"keras": folder / "m.keras", "h5": folder / "m.h5", "savedmodel": folder / "sm"}
    model.save(paths["keras"])
    model.save(paths["h5"])
    model.save(paths["savedmodel"], save_format="tf")
    marker.unlink(missing_ok=True)   # saving traced the Lambda
    return paths, marker


def _variant(paths, fmt, spelling, folder):
    """A copy of the `fmt` model whose stored JSON config is spelled `spelling`."""
    if fmt == "keras":
        target = folder / "m.keras"
        with zipfile.ZipFile(paths["keras"]) as src, zipfile.ZipFile(target, "w") as dst:
            for item in src.infolist():
                data = src.read(item)
                if item.filename == "config.json":
                    data = _respell(data.decode(), spelling).encode()
                dst.writestr(item, data)
        return target
    if fmt == "h5":
        import h5py

        target = folder / "m.h5"
        shutil.copy(paths["h5"], target)
        with h5py.File(target, "r+") as h5:
            h5.attrs["model_config"] = _respell(h5.attrs["model_config"], spelling)
        return target
    from tf_keras.protobuf import saved_metadata_pb2

    target = folder / "sm"
    shutil.copytree(paths["savedmodel"], target)
    meta = saved_metadata_pb2.SavedMetadata()
    meta.ParseFromString((target / "keras_metadata.pb").read_bytes())
    for node in meta.nodes:
        if node.metadata:
            node.metadata = _respell(node.metadata, spelling)
    (target / "keras_metadata.pb").write_bytes(meta.SerializeToString())
    return target


@pytest.mark.parametrize("fmt", ["keras", "h5", "savedmodel"])
def test_lambda_never_runs_without_trust(fmt, lambda_models, tmp_path):
    from compressor.backends.keras.load import load_keras_model

    paths, marker = lambda_models
    for spelling in SPELLINGS:
        folder = tmp_path / spelling
        folder.mkdir()
        path = _variant(paths, fmt, spelling, folder)
        with pytest.raises(ModelLoadError, match="Lambda layer 'touch'.*--trust-pickle"):
            load_keras_model(path)
        assert not marker.exists(), f"{fmt} {spelling}: the Lambda ran"
    # The test can fail: trusted, the escaped spelling loads and its Lambda runs.
    model = load_keras_model(_variant(paths, fmt, "escaped", tmp_path), trust_pickle=True)
    model.predict(__import__("numpy").zeros((1, 8, 8, 1), "float32"), verbose=0)
    assert marker.exists()
    marker.unlink()


@pytest.mark.parametrize("config, found", [
    ({"module": "os", "class_name": "function", "config": "system"}, "from module 'os'"),
    ({"class_name": "__lambda__", "config": {"code": "..."}}, "Lambda"),
    ({"class_name": "Sequential", "config": {"layers": [{"class_name": "Functional", "config": {
        "layers": [{"class_name": "TFOpLambda", "config": {"name": "w",
                                                          "function": "io.write_file"}}]}}]}},
     "op layer 'w' calling 'io.write_file'"),
    ({"class_name": "Dense", "config": {"name": "d", "units": 3}, "module": "keras.layers"}, None),
])
def test_config_scan_finds_code_anywhere_in_the_config(config, found, tmp_path):
    from compressor.backends.keras.config_scan import stored_code

    result = stored_code(tmp_path / "m.keras", [json.dumps(config)])
    assert result == found if found is None else found in result
