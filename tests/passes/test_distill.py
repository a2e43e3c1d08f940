"""Knowledge distillation on both backends (issue 4): the KD loss, its place in the training
loop (aligned teacher logits, pruning and QAT guided by the teacher), the teacher checks, and
the acceptance numbers measured on digits.

One suite, parametrized over the keras and torch kits of tests/support/distill_kits.py. Teachers and
the int8_prune30_kd runs are built once per backend (module-scoped fixtures).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from support.distill_kits import KITS, kit_fixture

import compressor as cz
from compressor.core.context import Data, ModelState
from compressor.errors import ModelLoadError, RecipeError
from compressor.config.recipe import load_recipe
from compressor.runtimes import inspect_artifact
from compressor.config.steps import DistillConfig, PruneConfig, QuantizeConfig

slow = pytest.mark.slow
FEW_LABELS = 100   # KD pays off where labels are scarce: the teacher's soft targets add information
# To convergence from scratch (350 steps): a from-scratch rate, held constant.
FEW_LABELS_TRAINING = {"epochs": 50, "batch_size": 16, "lr": 3e-3, "schedule": "constant"}
SEEDS = (0, 1)


@pytest.fixture(scope="module", params=sorted(KITS))
def kit(request):
    yield from kit_fixture(request.param)


@pytest.fixture(scope="module")
def teacher(kit):
    return kit.good_teacher()


@pytest.fixture(scope="module")
def loaded_teacher(kit, teacher):
    return kit.backend.load(teacher)   # as the pipeline hands it to the passes


# --- the KD loss, once per backend, with the same numbers ----------------------------------

STUDENT = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=np.float32)
TEACHER = np.array([[3.0, 2.0, 1.0], [0.0, 1.0, 4.0]], dtype=np.float32)
LABELS = np.array([2, 0], dtype=np.int64)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _expected_loss(config: DistillConfig, labels: np.ndarray | None) -> float:
    t, alpha = config.temperature, config.alpha
    if config.loss == "mse" or labels is None:
        term = np.mean((STUDENT - TEACHER) ** 2)
    else:
        soft = _log_softmax(TEACHER / t)
        term = t * t * np.mean(np.sum(np.exp(soft) * (soft - _log_softmax(STUDENT / t)), axis=1))
    if labels is None:
        return float(term)
    hard = -np.mean(_log_softmax(STUDENT)[np.arange(len(labels)), labels])
    return float(alpha * term + (1 - alpha) * hard)


@pytest.mark.parametrize("config, labels", [
    (DistillConfig(temperature=2.0, alpha=0.7), LABELS),
    (DistillConfig(temperature=4.0, alpha=0.3, loss="mse"), LABELS),
    (DistillConfig(), None),   # no labels: MSE on logits, the teacher term alone
], ids=["kl", "mse", "unlabelled"])
def test_kd_loss_is_the_formula(kit, config, labels):
    value = kit.loss_value(config, STUDENT, labels, TEACHER)
    assert value == pytest.approx(_expected_loss(config, labels), rel=1e-5)


def test_distill_step_needs_a_teacher_and_comes_before_ptq(kit):
    with pytest.raises(RecipeError, match="--teacher"):
        kit.apply(ModelState(model=None), DistillConfig(), kit.context())
    calibrated = ModelState(model=None, steps=(QuantizeConfig(mode="ptq"),))
    with pytest.raises(RecipeError, match="put distill before quantize"):
        kit.apply(calibrated, DistillConfig(), kit.context(teacher=object()))


# --- the training loop ---------------------------------------------------------------------

def test_teacher_logits_stay_aligned_with_shuffled_inputs(kit, teacher, loaded_teacher):
    """A student that is a copy of the teacher has nothing to learn from pure KD, unless the
    shuffled batches paired inputs with another sample's teacher logits."""
    ctx = kit.context(teacher=loaded_teacher)
    state = kit.apply(ModelState(model=kit.backend.clone(teacher)),
                      DistillConfig(alpha=1.0, epochs=1), ctx)
    agreement = np.mean(np.argmax(kit.backend.predict(state.model, kit.data.val[0]), -1)
                        == np.argmax(kit.backend.predict(teacher, kit.data.val[0]), -1))
    assert agreement >= 0.99
    assert state.last(DistillConfig) == DistillConfig(alpha=1.0, epochs=1)


def test_distilling_after_pruning_keeps_the_zeros(kit, loaded_teacher):
    ctx = kit.context(teacher=loaded_teacher)
    pruned = kit.apply(ModelState(model=kit.student(0)), PruneConfig(sparsity=0.3, epochs=0), ctx)
    zeros_before = [k == 0 for k in kit.kernels(pruned.model)]
    state = kit.apply(pruned, DistillConfig(epochs=1), ctx)
    kernels_after = kit.kernels(state.model)
    assert all(np.all(after[before] == 0) for before, after in zip(zeros_before, kernels_after))
    zeros = sum(int(np.sum(k == 0)) for k in kernels_after) / sum(k.size for k in kernels_after)
    assert zeros >= 0.29 and state.last(PruneConfig).sparsity == 0.3


@slow
def test_distill_after_qat_keeps_training_the_fake_quant_model_and_the_zeros(kit, loaded_teacher):
    """Recipes may put distill last: it then fine-tunes the QAT model, pruned zeros included."""
    ctx = kit.context(teacher=loaded_teacher)
    state = kit.apply(ModelState(model=kit.student(0)), PruneConfig(sparsity=0.3, epochs=0), ctx)
    state = kit.apply(state, QuantizeConfig(mode="qat", epochs=1), ctx)
    zeros_before = [k == 0 for k in kit.kernels(state.model)]
    before = kit.backend.predict(state.model, kit.data.val[0])
    state = kit.apply(state, DistillConfig(epochs=1), ctx)
    assert state.last(QuantizeConfig) is not None and state.last(DistillConfig) is not None
    assert not np.allclose(before, kit.backend.predict(state.model, kit.data.val[0]))
    assert sum(int(z.sum()) for z in zeros_before) >= 0.29 * sum(z.size for z in zeros_before)
    assert all(np.all(after[zero] == 0)
               for zero, after in zip(zeros_before, kit.kernels(state.model)))


def test_unlabelled_data_distils_on_logits(kit, teacher, loaded_teacher):
    unlabelled = Data(train=(kit.data.train[0], None), val=kit.data.val)
    student = kit.student(0)

    def distance() -> float:
        return float(np.mean((kit.backend.predict(student, kit.data.val[0])
                              - kit.backend.predict(teacher, kit.data.val[0])) ** 2))

    before = distance()
    student = kit.apply(ModelState(model=student), DistillConfig(epochs=6, lr=3e-3, schedule="constant"),
                        kit.context(unlabelled, teacher=loaded_teacher)).model
    print(f"{kit.name}: logit MSE to the teacher {before:.2f} -> {distance():.2f}, "
          f"accuracy without labels {kit.accuracy(student):.4f}")
    assert distance() < 0.25 * before
    assert kit.accuracy(student) >= 0.8   # it never saw a label: all it knows is the teacher's


@slow
def test_distillation_beats_plain_training_with_few_labels(kit, teacher, loaded_teacher):
    """Same student, seed, loop and epochs; alpha 0 drops the teacher term (plain training)."""
    x, y = kit.data.train
    few = Data(train=(x[:FEW_LABELS], y[:FEW_LABELS]), val=kit.data.val)
    example = kit.data.val[0][:2]
    teacher_params = kit.backend.describe(teacher, example).params
    plain, distilled = [], []
    for seed in SEEDS:
        student = kit.student(seed)
        assert 4 * kit.backend.describe(student, example).params <= teacher_params
        ctx = kit.context(few, seed, teacher=loaded_teacher)
        for alpha, results in ((0.0, plain), (0.7, distilled)):
            config = DistillConfig(alpha=alpha, temperature=4.0, **FEW_LABELS_TRAINING)
            results.append(kit.accuracy(kit.apply(ModelState(model=student), config,
                                                  ctx).model))
    print(f"{kit.name}: plain {plain} -> distilled {distilled}, teacher {kit.accuracy(teacher)}")
    assert np.mean(distilled) >= np.mean(plain) + 0.02


# --- int8_prune30_kd end to end (Python API), teacher checks --------------------------------

@pytest.fixture(scope="module")
def kd_run(kit, teacher, loaded_teacher, tmp_path_factory):
    student = kit.brief_student()
    teacher_weights = kit.weights(teacher)
    # The float student after the recipe's distill step, exactly as the pipeline runs it first.
    distill_step = load_recipe("int8_prune30_kd").steps[0]
    after_kd = kit.apply(ModelState(model=kit.backend.load(student)), distill_step,
                         kit.context(teacher=loaded_teacher))
    out = tmp_path_factory.mktemp(f"kd_{kit.name}") / "dist"
    result = cz.compress(student, "int8_prune30_kd", teacher=teacher, data="digits",
                         out_dir=out, quiet=True, latency=False)
    return {"result": result, "out": out, "student": kit.accuracy(student),
            "float_kd": kit.accuracy(after_kd.model), "teacher_weights": teacher_weights}


@slow
def test_int8_prune30_kd_artifacts_keep_the_distilled_accuracy_and_sparsity(kit, kd_run):
    result = kd_run["result"]
    assert result.passed, result.report["failures"]
    print(f"{kit.name}: student {kd_run['student']:.4f}, after KD {kd_run['float_kd']:.4f}, "
          + ", ".join(f"{a['format']} {a['metric_value']:.4f} (sparsity {a['sparsity']:.4f})"
                      for a in result.report["artifacts"]))
    assert kd_run["float_kd"] > kd_run["student"]
    for fmt, path in result.artifacts.items():
        row = next(a for a in result.report["artifacts"] if a["format"] == fmt)
        assert row["metric_value"] >= kd_run["float_kd"] - 0.01, fmt
        info = inspect_artifact(path)
        assert info.sparsity >= 0.28, fmt
        assert all(w.dtype == "int8" for w in info.weights if w.is_kernel), fmt


@slow
def test_teacher_is_recorded_unchanged_and_not_exported(kit, teacher, kd_run):
    report = json.loads((kd_run["out"] / "report.json").read_text())
    example = kit.data.val[0][:2]
    assert report["teacher"]["model"] == type(teacher).__qualname__
    assert report["teacher"]["params"] == kit.backend.describe(teacher, example).params
    assert report["teacher"]["metric_value"] == pytest.approx(kit.accuracy(teacher))
    assert all(np.array_equal(a, b) for a, b in zip(kd_run["teacher_weights"],
                                                    kit.weights(teacher)))
    assert sorted(p.name for p in kd_run["out"].iterdir()) == [
        "model.onnx", "model.tflite", "report.html", "report.json", "report.md"]


def test_teacher_with_other_outputs_is_refused_naming_both_shapes(kit, tmp_path):
    with pytest.raises(ModelLoadError) as error:
        cz.compress(kit.student(0), "int8_prune30_kd", teacher=kit.mismatched_teacher(),
                    data="digits", out_dir=tmp_path / "out", quiet=True)
    assert "(None, 10)" in str(error.value) and "(None, 5)" in str(error.value)
    assert not (tmp_path / "out").exists()


@slow
def test_cli_teacher_shape_mismatch_exits_2(kit, cli, tmp_path):
    models = kit.cli_models(tmp_path, kit.student(0), kit.mismatched_teacher())
    result = cli("--recipe", "int8_prune30_kd", *models, "--data", "digits",
                 "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert "(None, 10)" in result.stderr and "(None, 5)" in result.stderr
    assert not (tmp_path / "out").exists()


def test_pickled_teacher_needs_trust_pickle(kit, tmp_path):
    with pytest.raises(ModelLoadError, match="--trust-pickle"):
        cz.compress(kit.student(0), "int8_prune30_kd", teacher=str(kit.pickled_teacher(tmp_path)),
                    data="digits", out_dir=tmp_path / "out", quiet=True)
