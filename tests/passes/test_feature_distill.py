"""Intermediate-feature distillation (`distill.feature_pairs`, issue 15) on both backends: the
term trains the student, a projection bridges different widths and never reaches the exported
artifact, and a layer name the model lacks is a typed error naming the layers it has.

Models are untrained digits CNNs on a few hundred samples: the mechanics, not accuracy.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.distill_kits import KITS

import compressor as cz
from compressor.backends.feature_pairs import needs_projection, resolve_layer
from compressor.core.context import Data, ModelState
from compressor.errors import RecipeError
from compressor.runtimes import inspect_artifact
from compressor.config.steps import DistillConfig

slow = pytest.mark.slow
TEACHER_SHAPE = {"filters": (16, 32), "dense": 64}
STUDENT_SHAPE = {"filters": (8, 16), "dense": 24}
# Layer positions in both CNNs: (first conv, second conv, first dense). The student's second
# conv has the teacher's first conv's 16 channels at the same 8x8 resolution: no projection.
KERAS_LAYERS, TORCH_LAYERS = (0, 1, 4), ("0", "2", "7")
EXPORT = {"keras": "tflite", "torch": "onnx"}


@pytest.fixture(scope="module", params=sorted(KITS))
def kit(request):
    return KITS[request.param]()


@pytest.fixture(scope="module")
def small(kit):
    (x, y), (xv, yv) = kit.data.train, kit.data.val
    return Data(train=(x[:256], y[:256]), val=(xv[:128], yv[:128]), name="digits")


def _models(kit, seed=0):
    from compressor.backends import examples

    if kit.name == "torch":
        return (examples.torch_digits_cnn(seed=seed, **STUDENT_SHAPE),
                examples.torch_digits_cnn(seed=seed + 100, **TEACHER_SHAPE))
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    return examples.keras_digits_cnn(**STUDENT_SHAPE), examples.keras_digits_cnn(**TEACHER_SHAPE)


def _names(kit, model):
    if kit.name == "torch":
        return list(TORCH_LAYERS)
    return [model.layers[i].name for i in KERAS_LAYERS]


def _pairs(kit, student, teacher, *which):
    """(student layer, teacher layer) by position: 'wide' = conv 1 / conv 1 (8 vs 16
    channels), 'same' = conv 2 / conv 1 (16 / 16), 'dense' = dense 1 / dense 1 (24 vs 64)."""
    s, t = _names(kit, student), _names(kit, teacher)
    table = {"wide": (s[0], t[0]), "same": (s[1], t[0]), "dense": (s[2], t[2])}
    return [list(table[w]) for w in which]


def test_layer_names_resolve_exactly_or_under_tfmot_wrappers():
    layers = ["quantize_layer", "quant_conv2d", "prune_low_magnitude_dense"]
    assert resolve_layer("conv2d", layers, "student") == "quant_conv2d"
    assert resolve_layer("dense", layers, "student") == "prune_low_magnitude_dense"
    with pytest.raises(RecipeError, match="teacher has no layer named 'conv'; its layers are: "
                                          "quantize_layer, quant_conv2d"):
        resolve_layer("conv", layers, "teacher")
    assert needs_projection(("a", "b"), (None, 8, 8, 8), (None, 8, 8, 16), -1)
    assert not needs_projection(("a", "b"), (2, 16, 8, 8), (2, 16, 8, 8), 1)
    with pytest.raises(RecipeError, match=r"\(8, 8, 8\) and the teacher's \(4, 4, 16\)"):
        needs_projection(("a", "b"), (None, 8, 8, 8), (None, 4, 4, 16), -1)


@pytest.mark.parametrize("pairs", [[["a", ""]], [["a"]], [["a", "b", "c"]]])
def test_feature_pairs_must_be_pairs_of_names(pairs):
    with pytest.raises(ValueError, match="feature_pairs"):
        DistillConfig(feature_pairs=pairs)


def test_projection_only_where_widths_differ(kit, small):
    student, teacher = _models(kit)
    config = DistillConfig(feature_pairs=_pairs(kit, student, teacher, "wide", "same", "dense"))
    loaded_student, loaded_teacher = kit.backend.load(student), kit.backend.load(teacher)
    if kit.name == "torch":
        import torch

        from compressor.backends.torch.feature_distill import ChannelProjection, FeatureDistillation

        features = FeatureDistillation(loaded_student, loaded_teacher, config,
                                       [torch.from_numpy(small.train[0])])
        kinds = [type(p) for p in features.projections]
        assert kinds == [ChannelProjection, torch.nn.Identity, ChannelProjection]
        assert [p.linear.weight.shape for p in features.projections[::2]] == [(16, 8), (64, 24)]
        assert float(features.term().detach()) > 0
        features.close()
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in loaded_student.modules())
    else:
        from compressor.backends.keras.feature_distill import with_feature_terms

        training = with_feature_terms(loaded_student, config, loaded_teacher)
        projections = {layer.name: layer.units for layer in training.layers
                       if layer.name.startswith("feature_projection")}
        assert projections == {"feature_projection_0": 16, "feature_projection_2": 64}
        assert len(training.losses) == 1   # the feature terms, one symbolic loss
        assert training.count_params() > loaded_student.count_params()


def test_feature_term_changes_training_and_leaves_the_student_shape(kit, small):
    """Same seed and data: a feature weight of 0 vs 10 must train different students, each
    with exactly the student's parameters (the projections are gone)."""
    student, teacher = _models(kit)
    ctx = kit.context(small, teacher=kit.backend.load(teacher))
    example = small.val[0][:2]
    params = kit.backend.describe(student, example).params
    results = []
    for weight in (0.0, 10.0):
        config = DistillConfig(epochs=1, lr=1e-3, feature_weight=weight,
                               feature_pairs=_pairs(kit, student, teacher, "wide", "dense"))
        trained = kit.apply(ModelState(model=kit.backend.clone(kit.backend.load(student))),
                            config, ctx).model
        assert kit.backend.describe(trained, example).params == params
        results.append(kit.backend.predict(trained, small.val[0]))
    assert not np.allclose(results[0], results[1], atol=1e-4)


def _recipe(folder, pairs, export):
    path = folder / "feature_kd.yaml"
    path.write_text(textwrap.dedent(f"""
        name: feature_kd
        steps:
          - pass: distill
            epochs: 1
            feature_pairs: {pairs}
        export: [{export}]
        validate: {{metric: accuracy, max_drop: 1.0}}
    """))
    return path


@slow
def test_exported_artifact_has_no_trace_of_the_projection(kit, small, tmp_path):
    student, teacher = _models(kit)
    rows = {}
    for label, pairs in (("plain", []), ("features", _pairs(kit, student, teacher, "wide", "dense"))):
        result = cz.compress(student, _recipe(tmp_path, pairs, EXPORT[kit.name]), teacher=teacher,
                             data=small, out_dir=tmp_path / label, quiet=True, latency=False)
        rows[label] = result.report["artifacts"][0]
    assert rows["features"]["params"] == rows["plain"]["params"]   # the student's, + constants
    assert rows["features"]["size_bytes"] == rows["plain"]["size_bytes"]
    assert rows["features"]["macs"] == rows["plain"]["macs"]
    ops = {label: inspect_artifact(tmp_path / label / Path(row["path"]).name).ops
           for label, row in rows.items()}
    assert ops["features"] == ops["plain"]


@slow
def test_cli_unknown_layer_name_exits_2_naming_the_layers(kit, cli, tmp_path):
    student, teacher = _models(kit)
    models = _cli_models(kit, tmp_path, student, teacher)
    recipe = _recipe(tmp_path, [[_names(kit, student)[0], "no_such_layer"]], EXPORT[kit.name])
    result = cli("--recipe", str(recipe), *models, "--data", "digits",
                 "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr   # after the step's progress line
    assert "the teacher has no layer named 'no_such_layer'; its layers are: " in errors[0]
    assert _names(kit, teacher)[0] in errors[0].split("its layers are: ")[1]
    assert not (tmp_path / "out").exists()


def _cli_models(kit, folder, student, teacher):
    if kit.name == "keras":
        student.save(folder / "student.keras")
        teacher.save(folder / "teacher.keras")
        return [str(folder / "student.keras"), "--teacher", str(folder / "teacher.keras")]
    import torch

    (folder / "nets.py").write_text(textwrap.dedent(f"""
        from compressor.backends.examples import torch_digits_cnn

        def student():
            return torch_digits_cnn(**{STUDENT_SHAPE!r})

        def teacher():
            return torch_digits_cnn(**{TEACHER_SHAPE!r})
    """))
    torch.save(student.state_dict(), folder / "student.pt")
    torch.save(teacher.state_dict(), folder / "teacher.pt")
    return ["nets:student", "--weights", str(folder / "student.pt"), "--teacher",
            "nets:teacher", "--teacher-weights", str(folder / "teacher.pt")]


def test_teacher_term_stays_in_later_steps_only_when_asked():
    from compressor.config.steps import PruneConfig, QuantizeConfig

    later = (PruneConfig(sparsity=0.3), QuantizeConfig(), None)   # None: a user's plain loop
    default, guiding = DistillConfig(), DistillConfig(guide_later_steps=True)
    assert default.guides(default) and guiding.guides(guiding)
    assert not any(default.guides(step) for step in later)
    assert all(guiding.guides(step) for step in later)
