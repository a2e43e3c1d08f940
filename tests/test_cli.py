"""Bad input: exit code 2, one line naming the problem and the fix, no traceback, nothing written."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """An (untrained) tf_keras digits CNN saved as .keras; errors must not depend on training."""
    from compressor.backends.examples import keras_digits_cnn

    path = tmp_path_factory.mktemp("model") / "digits.keras"
    keras_digits_cnn().save(path)
    return path


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_clean_failure(result, *fragments, parent=None):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    if parent is not None:
        assert not (parent / "out").exists()
        assert not [p for p in parent.iterdir() if ".partial-" in p.name]


def test_missing_model_path(cli, tmp_path):
    result = cli("--recipe", "int8_prune30", "nope.keras", "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "nope.keras", "does not exist", parent=tmp_path)


def test_truncated_model_file(cli, tmp_path, model_file):
    broken = tmp_path / "broken.keras"
    broken.write_bytes(model_file.read_bytes()[:500])
    before = _digest(broken)
    result = cli("--recipe", "int8_prune30", str(broken), "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "broken.keras", parent=tmp_path)
    assert _digest(broken) == before


def test_unknown_recipe_suggests_closest(cli, tmp_path, model_file):
    result = cli("--recipe", "int8_prun30", str(model_file), "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "unknown recipe 'int8_prun30'", "did you mean 'int8_prune30'",
                          parent=tmp_path)


def test_recipe_out_of_range_names_the_key(cli, tmp_path, model_file):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nsteps:\n  - pass: prune\n    sparsity: 1.5\n")
    result = cli("--recipe", str(recipe), str(model_file), "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "steps.0.sparsity = 1.5", "less than 1", parent=tmp_path)


def test_recipe_unknown_key(cli, tmp_path, model_file):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nsteps:\n  - pass: prune\n    sparsity: 0.3\n    epoch: 2\n")
    result = cli("--recipe", str(recipe), str(model_file), "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "steps.0.epoch: unknown key", "did you mean 'epochs'",
                          parent=tmp_path)


def test_data_shape_mismatch(cli, tmp_path, model_file):
    data = tmp_path / "wrong.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x_train=rng.random((20, 28, 28, 1), dtype=np.float32),
             y_train=np.zeros(20, np.int64), x_val=rng.random((10, 28, 28, 1), dtype=np.float32),
             y_val=np.zeros(10, np.int64))
    result = cli("--recipe", "int8_prune30", str(model_file), "--data", str(data),
                 "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "have shape (N, 28, 28, 1) float32", "(N, 8, 8, 1) float32",
                          parent=tmp_path)


def test_non_empty_out_is_not_touched_without_force(cli, tmp_path, model_file):
    out = tmp_path / "out"
    out.mkdir()
    keep = out / "keep.txt"
    keep.write_text("mine")
    result = cli("--recipe", "int8_prune30", str(model_file), "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not empty" in result.stderr and "--force" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and keep.read_text() == "mine"


def test_unknown_target_device(cli, tmp_path, model_file):
    result = cli("--recipe", "int8_prune30", str(model_file), "--target", "jetson-orin-nx",
                 "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "jetson-orin-nx", parent=tmp_path)


def test_distill_recipe_without_teacher_names_the_flag(cli, tmp_path, model_file):
    result = cli("--recipe", "int8_prune30_kd", str(model_file), "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "--teacher", parent=tmp_path)


def test_missing_data_file(cli, tmp_path, model_file):
    result = cli("--recipe", "int8", str(model_file), "--data", "missing.npz",
                 "--out", str(tmp_path / "out"))
    _assert_clean_failure(result, "missing.npz", "does not exist", parent=tmp_path)
