"""Builds the zoo case's artifacts for one framework, in its own process:

    python -m bench.zoo_build keras|torch OUT_DIR   -> one JSON line {net: {label: path}}

Per net (bench/zoo_nets.py, random init, BatchNorm statistics set from the data): the
toolkit's fp32 and int8 (`compressor.compress`, recipes fp32 / int8, both formats) and the
vendor tools' int8 made as their documentation shows: onnxruntime `quantize_static` (QDQ,
per-channel, after quant_pre_process) on the toolkit's fp32 ONNX, and for Keras
TFLiteConverter full int8 on the model, both calibrated on the toolkit's calibration images.
Data: smooth random images; the labels are the float model's own predictions, so
"accuracy" is top-1 agreement with fp32.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench.zoo_nets import INPUT_HW, ZOO, build_keras, build_torch

TRAIN, VAL = 256, 256
# The vendor tools calibrate on the images the toolkit's `int8` recipe calibrates on (its
# calibration_samples: 256 = all of TRAIN, in order), so the comparison is of the tools, not
# of two calibration draws: on these random-init nets, whose top-1 margins are small, the
# draw alone moves agreement by several points (Keras MobileNetV2 TFLite, TFLiteConverter
# full int8 on four 64-image subsets: 0.715-0.781; on all 256: 0.758, byte-identical to the
# toolkit's file).
VENDOR_CALIBRATION = TRAIN


def images(count: int, layout: str, seed: int) -> np.ndarray:
    """Smooth random images (upsampled 8x8 noise), roughly like natural-image statistics."""
    rng = np.random.default_rng(seed)
    small = rng.random((count, 8, 8, 3), dtype=np.float32)
    x = np.repeat(np.repeat(small, INPUT_HW // 8, axis=1), INPUT_HW // 8, axis=2)
    x = (x - 0.5) / 0.25
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if layout == "NCHW" else x)


def set_batchnorm_statistics(framework: str, model, x: np.ndarray) -> None:
    """Random-init BatchNorm (mean 0, var 1) makes a random net's outputs near constant:
    statistics measured on data give a net whose predictions depend on its input."""
    if framework == "torch":
        import torch

        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None          # cumulative average over the batches
        model.train()
        with torch.no_grad():
            for start in range(0, len(x), 64):
                model(torch.from_numpy(x[start:start + 64]))
        model.eval()
        return
    for layer in model.layers:
        if layer.__class__.__name__ == "BatchNormalization":
            layer.momentum = 0.0               # one call sets the statistics of that batch
    model(x[:128], training=True)


def predict(framework: str, model, x: np.ndarray) -> np.ndarray:
    if framework == "torch":
        import torch

        with torch.no_grad():
            return model(torch.from_numpy(x)).numpy()
    return model(x, training=False).numpy()


def vendor_onnx(fp32: Path, out: Path, x: np.ndarray) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader:
        def __init__(self):
            self.items = iter([{name: x[i:i + 1]} for i in range(len(x))])

        def get_next(self):
            return next(self.items, None)

    import onnx

    name = onnx.load(str(fp32)).graph.input[0].name
    pre = out.with_name("vendor_pre.onnx")
    quant_pre_process(str(fp32), str(pre))
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    pre.unlink()


def vendor_tflite(model, out: Path, x: np.ndarray) -> None:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([x[i:i + 1]] for i in range(len(x)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    out.write_bytes(converter.convert())


def main(framework: str, out_dir: Path) -> dict:
    import compressor as cz

    layout = "NCHW" if framework == "torch" else "NHWC"
    build = build_torch if framework == "torch" else build_keras
    made = {}
    for name, spec in ZOO.items():
        model = build(spec)
        x_train, x_val = images(TRAIN, layout, 1), images(VAL, layout, 2)
        set_batchnorm_statistics(framework, model, x_train)
        data = cz.Data(train=(x_train, predict(framework, model, x_train).argmax(1)),
                       val=(x_val, predict(framework, model, x_val).argmax(1)), name="zoo")
        where, paths = out_dir / f"{name}_{framework}", {}
        for recipe in ("fp32", "int8"):
            ref = str(Path(__file__).parent / "recipes" / "fp32.yaml") if recipe == "fp32" \
                else "int8"
            result = cz.compress(model, recipe=ref, data=data, out_dir=where / recipe,
                                 latency=False, quiet=True, force=True)
            paths.update({f"toolkit_{recipe}_{fmt}": str(p) for fmt, p in result.artifacts.items()})
        vendor = where / "vendor"
        vendor.mkdir(parents=True, exist_ok=True)
        calibration = x_train[:VENDOR_CALIBRATION]
        vendor_onnx(Path(paths["toolkit_fp32_onnx"]), vendor / "model.onnx", calibration)
        paths["vendor_int8_onnx"] = str(vendor / "model.onnx")
        if framework == "keras":
            vendor_tflite(model, vendor / "model.tflite", calibration)
            paths["vendor_int8_tflite"] = str(vendor / "model.tflite")
        np.savez(where / "val.npz", x_val=x_val, y_val=data.val[1])
        paths["val"] = str(where / "val.npz")
        made[name] = paths
    return made


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
