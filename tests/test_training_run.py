"""`prepare` / `finalize` around a plain user-style training loop, one suite for both backends.

Acceptance of issue 7's training-loop API: a Keras `fit` and a PyTorch loop drive the pruning
of int8_prune30 fed from a tf.data Dataset / torch DataLoader, and the artifacts match
`compress` on the same model and recipe (accuracy within 0.01, >= 28% zeros read back from
the files); plus the typed errors for misuse.
"""
from __future__ import annotations

import numpy as np
import pytest

import compressor as cz
from compressor.backends import examples
from compressor.tasks.array.data import digits
from compressor.errors import BackendUnavailableError, DataError, RecipeError, UsageError
from compressor.run.pipeline import compress
from compressor.runtimes import inspect_artifact

BACKENDS = ("keras", "torch")
LAYOUT = {"keras": "NHWC", "torch": "NCHW"}
BATCH = 32
FAST = {"quiet": True, "latency": False}


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def data(backend):
    return digits(LAYOUT[backend])


@pytest.fixture(scope="module")
def untrained(backend):
    """For the error paths: they never train or export."""
    return examples.keras_digits_cnn() if backend == "keras" else examples.torch_digits_cnn()


@pytest.fixture(scope="module")
def trained(backend):
    if backend == "keras":
        return examples.train_keras_digits_cnn(epochs=8)
    return examples.train_torch_digits_cnn(epochs=8)


def native_dataset(backend, split, shuffle=False):
    """The split as the framework's own input pipeline: tf.data or a torch DataLoader."""
    if backend == "keras":
        from compressor.backends.keras.env import import_tensorflow

        dataset = import_tensorflow().data.Dataset.from_tensor_slices(split)
        return (dataset.shuffle(len(split[0]), seed=0) if shuffle else dataset).batch(BATCH)
    import torch

    tensors = torch.utils.data.TensorDataset(*(torch.from_numpy(a) for a in split))
    return torch.utils.data.DataLoader(tensors, batch_size=BATCH, shuffle=shuffle,
                                       generator=torch.Generator().manual_seed(0))


def user_loop(backend, run, train, epochs=2, lr=1e-3):
    """What a user writes: Keras compile + fit with run.callbacks; a plain PyTorch loop."""
    if backend == "keras":
        import tf_keras as keras

        run.model.compile(keras.optimizers.Adam(lr), _keras_loss())
        run.model.fit(train, epochs=epochs, callbacks=run.callbacks, verbose=0)
        return
    import torch

    torch.manual_seed(0)
    optimizer = torch.optim.Adam(run.model.parameters(), lr=lr)
    run.model.train()
    for _ in range(epochs):
        for x, y in train:
            optimizer.zero_grad()
            loss = run.loss(run.model(x), y, inputs=x)
            loss.backward()
            optimizer.step()
            run.step()


@pytest.fixture(scope="module")
def runs(backend, trained, data, tmp_path_factory):
    """The same model and recipe through compress and through prepare / user loop / finalize."""
    folder = tmp_path_factory.mktemp(f"{backend}-training-run")
    baseline = compress(trained, "int8_prune30", data, out_dir=folder / "compress", **FAST)
    native = cz.Data(train=native_dataset(backend, data.train, shuffle=True),
                     val=native_dataset(backend, data.val))
    run = cz.prepare(trained, "int8_prune30", data=native, **FAST)
    user_loop(backend, run, native.train)
    result = run.finalize(out_dir=folder / "prepare")
    return {"compress": baseline, "prepare": result, "run": run}


def _artifact(result, fmt):
    return next(a for a in result.report["artifacts"] if a["format"] == fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_user_loop_matches_compress(runs, fmt):
    ours, theirs = _artifact(runs["prepare"], fmt), _artifact(runs["compress"], fmt)
    print(f"{fmt}: prepare/finalize {ours['metric_value']:.4f} (sparsity {ours['sparsity']:.4f}),"
          f" compress {theirs['metric_value']:.4f} (sparsity {theirs['sparsity']:.4f})")
    assert runs["prepare"].passed and runs["compress"].passed
    assert abs(ours["metric_value"] - theirs["metric_value"]) <= 0.01, (ours, theirs)
    assert ours["drop"] <= 0.01


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_user_loop_artifacts_are_int8_and_sparse_in_the_file(runs, fmt):
    info = inspect_artifact(runs["prepare"].artifacts[fmt])
    kernels = [w for w in info.weights if w.is_kernel]
    assert {w.dtype for w in kernels} == {"int8"}
    assert sum(w.zeros for w in kernels) / sum(w.size for w in kernels) >= 0.28


@pytest.mark.slow
def test_report_says_which_step_the_user_loop_drove(runs, backend):
    report = runs["prepare"].report
    steps = report["user_loop"]["steps_counted"]
    assert report["user_loop"]["step"] == "prune"
    assert steps == (0 if backend == "keras" else 2 * 43)   # Keras: the wrappers count
    assert {"prune", "quantize", "export_onnx"} <= set(report["timings_s"])


@pytest.mark.slow
def test_a_finalized_run_refuses_more_calls(runs, tmp_path):
    run = runs["run"]
    with pytest.raises(UsageError, match="after run.finalize"):
        run.finalize(out_dir=tmp_path / "again")
    with pytest.raises(UsageError, match="after run.finalize"):
        run.step()
    assert not (tmp_path / "again").exists()


@pytest.mark.slow
def test_qat_recipe_trains_the_fake_quant_model_in_the_loop(backend, trained, data, tmp_path):
    run = cz.prepare(trained, "int8_qat", data=data, steps=10, formats=("onnx",), **FAST)
    assert run.loop_step.kind == "quantize"
    batches = [_batch(backend, *data.train, i) for i in range(10)]
    if backend == "keras":   # one fit over the 10 batches
        batches = (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))
        run.model.compile("adam", _keras_loss())
        run.model.fit(*batches, batch_size=BATCH, epochs=1, callbacks=run.callbacks, verbose=0)
    else:   # .train() on the exported fake-quant graph works through the wrapper
        user_loop(backend, run, batches, epochs=1)
    result = run.finalize(out_dir=tmp_path / "qat")
    artifact = result.report["artifacts"][0]
    assert artifact["metric_value"] >= result.report["baseline"]["value"] - 0.02, artifact
    kernels = [w for w in inspect_artifact(result.artifacts["onnx"]).weights if w.is_kernel]
    assert {w.dtype for w in kernels} == {"int8"}


def test_custom_loop_with_steps_reaches_the_sparsity(backend, untrained, data):
    """steps= sets the schedule; a GradientTape loop (Keras) or a plain loop (PyTorch)."""
    run = cz.prepare(untrained, "int8_prune30", data=data, steps=12, **FAST)
    x, y = data.train
    if backend == "keras":
        _gradient_tape_loop(run, x, y, steps=12)
    else:
        user_loop(backend, run, [_batch(backend, x, y, i) for i in range(12)], epochs=1)
    assert run.steps_taken == 12
    assert _masked_fraction(backend, run.model) == pytest.approx(0.30, abs=0.01)
    run.close()


def test_misuse_raises_typed_errors(backend, untrained, data, tmp_path):
    with pytest.raises(UsageError, match="finalize"):
        cz.prepare(untrained, "int8_prune30", data=data, out_dir=tmp_path / "x")
    with pytest.raises(UsageError, match="positive int"):
        cz.prepare(untrained, "int8_prune30", data=data, steps=0)
    other = "torch" if backend == "keras" else "keras"
    wrong = cz.Data(train=data.train, val=native_dataset(other, digits(LAYOUT[other]).val))
    with pytest.raises(DataError, match=f"but the model is a {backend} model"):
        cz.prepare(untrained, "int8_prune30", data=wrong, **FAST)

    run = cz.prepare(untrained, "int8_prune30", data=data, **FAST)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(RecipeError, match="not empty"):
        run.finalize(out_dir=taken)
    run.step()   # still open: a refused folder does not end the run
    if backend == "keras":
        with pytest.raises(UsageError, match="compile run.model"):
            run.loss(None, None)
    run.close()
    with pytest.raises(UsageError, match="after run.finalize"):
        run.step()


def test_recipe_without_training_step_hands_over_a_trainable_copy(backend, untrained, data):
    run = cz.prepare(untrained, "int8", data=data, **FAST)
    assert run.loop_step is None and run.callbacks == []
    assert run.model is not untrained
    assert "plain fine-tuning" in repr(run)
    run.close()


def test_distill_step(backend, untrained, data):
    if backend == "keras":
        with pytest.raises(BackendUnavailableError, match="own Keras loop"):
            cz.prepare(untrained, "int8_prune30_kd", data=data, teacher=untrained, **FAST)
        return
    import torch

    run = cz.prepare(untrained, "int8_prune30_kd", data=data, teacher=untrained, **FAST)
    assert run.loop_step.kind == "distill"
    x, y = _batch(backend, *data.train, 0)
    with pytest.raises(UsageError, match="inputs=x"):
        run.loss(run.model(x), y)
    # The student is a copy of the teacher: the KD term is zero, the label term is not.
    loss = run.loss(run.model(x), y, inputs=x)
    alpha = run.loop_step.alpha
    expected = (1 - alpha) * torch.nn.functional.cross_entropy(run.model(x), y)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    run.close()


# ---------------------------------------------------------------------------------- helpers

def _batch(backend, x, y, index):
    rows = slice(index * BATCH, (index + 1) * BATCH)
    if backend == "keras":
        return x[rows], y[rows]
    import torch

    return torch.from_numpy(x[rows]), torch.from_numpy(y[rows])


def _keras_loss():
    import tf_keras as keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _gradient_tape_loop(run, x, y, steps):
    import tensorflow as tf
    import tf_keras as keras

    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = _keras_loss()
    for index in range(steps):
        rows = slice(index * BATCH, (index + 1) * BATCH)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], run.model(x[rows], training=True))
        variables = run.model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        run.step()


def _masked_fraction(backend, model) -> float:
    """The share of kernel weights the current masks remove."""
    if backend == "keras":
        masks = [np.asarray(mask) for layer in model.layers
                 for _, mask, _ in getattr(layer, "pruning_vars", [])]
    else:
        masks = [(p.detach().numpy() != 0) for name, p in model.named_parameters()
                 if name.endswith("weight") and p.dim() >= 2]
    return 1.0 - sum(m.sum() for m in masks) / sum(m.size for m in masks)


def test_prepare_is_public_and_lazy():
    assert cz.prepare.__module__ == "compressor.run.user_loop"
    assert "prepare" in cz.__all__ and "TrainingRun" in cz.__all__
