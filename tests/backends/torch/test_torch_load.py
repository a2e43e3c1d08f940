"""What only the PyTorch backend has: model references (module:function, file.py:function)
with --weights, pickles and TorchScript behind --trust-pickle, .pt2 programs, describe's
example input, train mode kept by predict, permanent pruning and its sparsity schedule.

The backend behaviour shared with Keras is tested once for both in test_backend_*.py.
"""
from __future__ import annotations

from pathlib import Path

from support import helpers
import numpy as np
import pytest
import torch
import torch_models as tm

from compressor.backends.torch import TorchBackend
from compressor.core.context import Data, ModelState
from compressor.tasks.array.data import digits
from compressor.errors import BackendUnavailableError, DataError, ModelLoadError
from compressor.config.steps import PruneConfig


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data() -> Data:
    return digits("NCHW")


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return TorchBackend()


@pytest.fixture(scope="module")
def ctx(data, tmp_path_factory):
    return helpers.context(data, tmp_path_factory.mktemp("torch") / "work")


@pytest.fixture(scope="module")
def model():
    """An untrained digits CNN in eval mode: loading does not need a good model."""
    return tm.digits_cnn().eval()


# --- model references and weights ------------------------------------------------------------

def test_module_function_with_weights_loads_the_weights(backend, model, data, tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(model.state_dict(), weights)
    loaded = backend.load("torch_models:digits_cnn", weights=str(weights))
    np.testing.assert_allclose(backend.predict(loaded, data.val[0][:16]),
                               backend.predict(model, data.val[0][:16]), rtol=1e-5, atol=1e-5)


def test_file_path_reference_is_imported(backend, tmp_path):
    code = tmp_path / "my_model.py"
    code.write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    assert isinstance(backend.load(f"{code}:build"), torch.nn.Linear)


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:build", "cannot import no_such_module_xyz"),
    ("torch_models:no_such_function", "has no function 'no_such_function'"),
    ("torch_models:accuracy", "raised TypeError"),
    ("missing.pt2", "does not exist"),
])
def test_bad_references_raise_model_load_error(backend, ref, message):
    with pytest.raises(ModelLoadError, match=message):
        backend.load(ref)


def test_mismatched_weights_list_missing_and_unexpected_keys(backend, tmp_path):
    weights = tmp_path / "w.pt"
    state = tm.digits_cnn().state_dict()
    state["extra.weight"] = state.pop("head.3.weight")
    torch.save(state, weights)
    with pytest.raises(ModelLoadError, match=r"missing keys: head\.3\.weight.*unexpected keys: "
                                             r"extra\.weight"):
        backend.load("torch_models:digits_cnn", weights=str(weights))


def test_weights_of_another_shape_are_refused(backend, tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(tm.DigitsCNN(filters=(8, 16)).state_dict(), weights)
    with pytest.raises(ModelLoadError, match="size mismatch"):
        backend.load("torch_models:digits_cnn", weights=str(weights))


def test_missing_weights_file(backend, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist; check the --weights path"):
        backend.load("torch_models:digits_cnn", weights=str(tmp_path / "nope.pt"))


# --- files: pickles, TorchScript, .pt2 -------------------------------------------------------

def test_pickled_module_needs_trust_pickle(backend, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(tm.digits_cnn(), path)
    with pytest.raises(ModelLoadError, match="is a pickled module; loading it runs code from the "
                                             "file. Pass --trust-pickle"):
        backend.load(str(path))
    assert isinstance(backend.load(str(path), trust_pickle=True), tm.DigitsCNN)


def test_torchscript_needs_trust_pickle(backend, tmp_path):
    path = tmp_path / "model.ts"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(path))
    with pytest.raises(ModelLoadError, match="TorchScript module.*--trust-pickle"):
        backend.load(str(path))
    assert isinstance(backend.load(str(path), trust_pickle=True), torch.nn.Module)


@pytest.mark.parametrize("name, content, message", [
    ("garbage.pt", b"not a model", "not a readable PyTorch file"),
    ("garbage.pt2", b"not a model", "not a readable .pt2 file"),
    ("weights_only.pt", None, "holds only weights"),
])
def test_unreadable_or_wrong_files_raise_model_load_error(backend, tmp_path, name, content,
                                                          message):
    path = tmp_path / name
    if content is None:
        torch.save(tm.digits_cnn().state_dict(), path)
    else:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        backend.load(str(path))


def test_pt2_with_dynamic_batch_loads_and_describes(backend, model, data, tmp_path):
    path = tmp_path / "model.pt2"
    x = torch.from_numpy(data.val[0][:2])
    torch.export.save(torch.export.export(model, (x,),
                                          dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)), path)
    loaded = backend.load(str(path))
    np.testing.assert_allclose(backend.predict(loaded, data.val[0]),
                               backend.predict(model, data.val[0]), rtol=1e-4, atol=1e-4)
    info = backend.describe(loaded)   # an exported graph declares its input: no example needed
    assert (info.input_shape, info.input_dtype, info.output_shape) == \
        ((None, 1, 8, 8), "float32", (None, 10))
    # an exported program's shape guard (an AssertionError) is a data error, not an internal one
    with pytest.raises(DataError, match=r"cannot run inputs input \(N, 3, 8, 8\) float32 "
                                        r".*it takes x \(N, 1, 8, 8\) float32"):
        backend.describe(loaded, np.zeros((2, 3, 8, 8), np.float32))


def test_pt2_with_fixed_batch_is_refused(backend, model, data, tmp_path):
    path = tmp_path / "fixed.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(data.val[0][:1]),)), path)
    with pytest.raises(ModelLoadError, match="fixed batch size of 1; export it with a dynamic"):
        backend.load(str(path))


# --- describe, predict, typed errors ---------------------------------------------------------

def test_describe_needs_and_checks_an_example(backend, data):
    model = tm.digits_cnn()
    info = backend.describe(model, data.val[0][:2])
    assert info.params == sum(p.numel() for p in model.parameters())
    assert (info.input_shape, info.input_dtype, info.output_shape) == \
        ((None, 1, 8, 8), "float32", (None, 10))
    assert info.size_bytes == 4 * info.params
    with pytest.raises(DataError, match="needs example inputs"):
        backend.describe(model)
    with pytest.raises(DataError, match="PyTorch images are NCHW"):
        backend.describe(model, np.zeros((2, 8, 8, 1), np.float32))


def test_predict_leaves_train_mode_as_it_was(backend, data):
    model = tm.digits_cnn().train()
    backend.predict(model, data.val[0][:4])
    assert model.training


def test_unknown_export_format_raises_a_typed_error(backend, ctx):
    state = ModelState(model=tm.digits_cnn())
    with pytest.raises(BackendUnavailableError, match="cannot export to 'tfjs'"):
        backend.export(state, "tfjs", Path("model.tfjs"), ctx)


# --- pruning ---------------------------------------------------------------------------------

def test_one_shot_pruning_is_permanent(backend, ctx):
    state = helpers.apply(backend, ModelState(model=backend.load(tm.digits_cnn())),
                          PruneConfig(sparsity=0.3, epochs=0), ctx)
    for name, weight in state.model.state_dict().items():
        if name.endswith("weight"):
            assert abs(float((weight == 0).float().mean()) - 0.3) < 0.002, name
    assert all(not n.endswith(("_orig", "_mask")) for n in state.model.state_dict())
    assert all(not m._forward_pre_hooks for m in state.model.modules())


def test_polynomial_schedule_reaches_the_target_before_the_last_epoch():
    from compressor.backends.torch.prune import SparsitySchedule

    schedule = SparsitySchedule.for_run(PruneConfig(sparsity=0.3, epochs=2), steps_per_epoch_=43)
    assert schedule.sparsity(0) == 0.0
    assert 0.0 < schedule.sparsity(20) < 0.3
    assert schedule.sparsity(43) == pytest.approx(0.3)
    assert schedule.sparsity(86) == pytest.approx(0.3)
