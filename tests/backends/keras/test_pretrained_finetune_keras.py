"""Issue 15 acceptance (Keras): trained nets keep their accuracy through the built-in
`int8_prune30` and `int8_qat` at default settings (fine-tuning rate, warmup + cosine, the best
epoch kept, QAT BatchNorm frozen after the first epoch): drop <= 1 pt on the exported int8
TFLite, gate passed, int8 weights kept. Nets: ResNet-style (BatchNorm, skip Adds),
MobileNetV2-style (depthwise + BatchNorm, inverted residuals, ReLU6) and an MLP, tf_keras
Functional, fitted from scratch here on digits (module scope).

Budget: the TFLite export only (the Keras route's ONNX is converted from it) and no latency
measurement; the nets train for 6-20 short epochs."""
from __future__ import annotations

import pytest

import compressor as cz
from compressor.tasks.array.data import digits

from support import pretrained_nets_keras as pn

pytest.importorskip("tensorflow_model_optimization")

RECIPES = ("int8_prune30", "int8_qat")


@pytest.fixture(scope="module")
def trained():
    data = digits("NHWC")
    return data, {net: pn.pretrained(net, data) for net in pn.NETS}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("net", pn.NETS)
def test_builtin_recipe_keeps_a_trained_nets_accuracy(trained, net, recipe, tmp_path):
    data, nets = trained
    result = cz.compress(nets[net], recipe, data, out_dir=tmp_path / "out", quiet=True,
                         formats=("tflite",), latency=False)
    report = result.report
    assert report["baseline"]["value"] >= 0.97, f"{net} is not trained well enough"
    (row,) = report["artifacts"]
    assert row["drop"] <= 0.01, f"{net} {recipe}: {report['baseline']['value']:.4f} -> " \
                                f"{row['metric_value']:.4f}"
    assert result.passed and result.exit_code == 0 and report["gate"]["passed"] is True
    assert row["int8_weight_share"] >= 0.9
