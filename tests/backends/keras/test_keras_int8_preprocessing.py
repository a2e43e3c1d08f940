"""A keras.applications-style net (Rescaling(1/255) + Normalization before the stem conv) fed
images in [0, 1]: its int8 ONNX quantizes the raw image, the preprocessing folded into the stem
conv (export/onnx_input_fold.py), through tf2onnx's graph and the int8 read-back check; fed
the [0, 255] it expects, the file keeps its preprocessing ops."""
from __future__ import annotations

import pytest
from support import helpers
from support import keras_applications_like as kal

from compressor.context import Data


def _int8_onnx_ops(data: Data, folder) -> list[str]:
    import onnx

    from compressor.backends.keras import KerasBackend
    from compressor.context import ModelState
    from compressor.export.int8 import export_checked
    from compressor.schemes import Int8Static, apply_scheme
    from compressor.steps import QuantizeConfig

    backend = KerasBackend()
    ctx = helpers.context(data, folder / "work")
    config = QuantizeConfig(mode="ptq", calibration_samples=32)
    state = apply_scheme(backend, ModelState(model=kal.applications_like()),
                         Int8Static.from_step(config), ctx).after(config)
    path = export_checked(backend, state, "onnx", folder / "model.onnx", ctx)
    return [node.op_type for node in onnx.load(str(path)).graph.node]


@pytest.mark.slow
def test_unit_images_reach_the_stem_conv_raw(tmp_path):
    raw = kal.quadrant_data(train=64, val=16)
    unit = Data(train=(raw.train[0] / 255.0, raw.train[1]), val=(raw.val[0] / 255.0, raw.val[1]))
    ops = _int8_onnx_ops(unit, tmp_path / "unit")
    assert set(ops[:ops.index("Conv")]) == {"QuantizeLinear", "DequantizeLinear", "Transpose"}
    ops = _int8_onnx_ops(raw, tmp_path / "raw")
    assert {"Mul", "Add"} & set(ops[:ops.index("Conv")]), ops[:ops.index("Conv")]
