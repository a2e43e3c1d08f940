"""Hand-written baseline: a PyTorch model (.pt2) -> .onnx with torch.onnx, torchao PT2E and
onnxruntime.quantization.

What a competent engineer writes directly against the libraries, no toolkit:

    python torch_onnx.py MODEL.pt2 --recipe fp32|fp16|int8|int8_prune30[,...] \
        --data digits|data.npz --out DIR [--evaluate]

One recipe writes DIR/model.onnx; a comma-separated list writes DIR/RECIPE/model.onnx.

fp32: torch.onnx.export(dynamo=True). fp16: onnxruntime.transformers.float16 on the fp32
file, float32 I/O. int8: onnxruntime quant_pre_process + quantize_static (QDQ, per-channel
int8 weights, 256 calibration samples). int8_prune30: 30% magnitude pruning per weight
tensor (polynomial schedule, 2 epochs, masks re-applied after every step), then torchao
PT2E QAT (X86InductorQuantizer, 2 epochs, masks kept), convert_pt2e, torch.onnx.export.
--evaluate prints the float model's and the artifact's val accuracy (onnxruntime).
"""
import time

T0 = time.perf_counter()   # before the framework imports: timings_s["import"] covers them

import argparse
import json
import os

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

import numpy as np
import onnxruntime as ort
import torch

IMPORT_S = time.perf_counter() - T0

BATCH, LR, EPOCHS, CALIBRATION = 32, 1e-3, 2, 256
DYNAMIC = ({0: torch.export.Dim.DYNAMIC},)
RECIPES = ("fp32", "fp16", "int8", "int8_prune30")


def load_data(spec):
    if spec == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x = (bunch.images / 16.0).astype(np.float32)[:, None]
        y = bunch.target.astype(np.int64)
        x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0,
                                                          stratify=y)
        return (x_train, y_train), (x_val, y_val)
    with np.load(spec) as npz:
        return (npz["x_train"], npz["y_train"]), (npz["x_val"], npz["y_val"])


def export_onnx(model, example, path):
    torch.onnx.export(model, (example,), path, dynamo=True, dynamic_shapes=DYNAMIC,
                      input_names=["x"], output_names=["logits"], external_data=False, verbose=False)


def weight_params(model):
    return [p for name, p in model.named_parameters() if p.ndim > 1]


def apply_masks(params, masks):
    with torch.no_grad():
        for p, m in zip(params, masks):
            p.mul_(m)


def magnitude_masks(params, sparsity):
    masks = []
    for p in params:
        k = round(sparsity * p.numel())
        if k == 0:
            masks.append(torch.ones_like(p))
            continue
        threshold = p.detach().abs().flatten().kthvalue(k).values
        masks.append((p.detach().abs() > threshold).float())
    return masks


def train(model, x, y, epochs, on_step):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for lo in range(0, len(x), BATCH):
            idx = order[lo:lo + BATCH]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            on_step()


def prune_then_qat(model, x, y, example, sparsity=0.30):
    from torchao.quantization.pt2e import (
        move_exported_model_to_eval,
        move_exported_model_to_train,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    params = weight_params(model)
    # ramp to full sparsity over all but the last epoch (10 mask updates), then recover;
    # polynomial schedule s_t = s * (1 - (1 - t/T)^3), as tfmot's PolynomialDecay
    end_step = int(np.ceil(len(x) / BATCH)) * max(EPOCHS - 1, 1)
    frequency = max(1, end_step // 10)
    end_step = frequency * (end_step // frequency)
    step = {"n": 0, "masks": None}

    def prune_step():
        step["n"] += 1
        if step["n"] % frequency == 0 and step["n"] <= end_step:
            current = sparsity * (1 - (1 - step["n"] / end_step) ** 3)
            step["masks"] = magnitude_masks(params, current)
        if step["masks"] is not None:
            apply_masks(params, step["masks"])

    train(model, x, y, EPOCHS, prune_step)
    graph = torch.export.export(model, (example,), dynamic_shapes=DYNAMIC).module()
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(graph, quantizer)
    qat_params = weight_params(prepared)
    qat_masks = [(p != 0).float() for p in qat_params]
    move_exported_model_to_train(prepared)
    train(prepared, x, y, EPOCHS, lambda: apply_masks(qat_params, qat_masks))
    move_exported_model_to_eval(prepared)
    return convert_pt2e(prepared)


class Calibration:
    """onnxruntime.quantization.CalibrationDataReader over the first training samples."""

    def __init__(self, x, name):
        self.batches = iter([{name: x[i:i + 1]} for i in range(min(CALIBRATION, len(x)))])

    def get_next(self):
        return next(self.batches, None)


def quantize_int8(fp32_path, path, x_train, workdir):
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    prepped = os.path.join(workdir, "fp32_prepped.onnx")
    quant_pre_process(fp32_path, prepped)
    name = ort.InferenceSession(prepped, providers=["CPUExecutionProvider"]).get_inputs()[0].name
    quantize_static(prepped, path, Calibration(x_train, name), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8)
    os.remove(prepped)


def to_fp16(fp32_path, path):
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(fp32_path), keep_io_types=True), path)


def onnx_accuracy(path, x, y):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    return float(np.mean(np.argmax(logits, 1) == y))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--recipe", required=True, help="one or more of " + ",".join(RECIPES))
    parser.add_argument("--data", default="digits")
    parser.add_argument("--out", required=True)
    parser.add_argument("--evaluate", action="store_true")
    args = parser.parse_args()
    recipes = args.recipe.split(",")
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {RECIPES}")
    (x_train, y_train), (x_val, y_val) = load_data(args.data)
    example = torch.from_numpy(x_train[:2])
    results = {}
    for recipe in recipes:
        started = time.perf_counter()
        torch.manual_seed(0)
        out = args.out if len(recipes) == 1 else os.path.join(args.out, recipe)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "model.onnx")
        make_artifact(args.model, recipe, x_train, y_train, example, path)
        timings = {"import": round(IMPORT_S, 3), "make": round(time.perf_counter() - started, 3)}
        results[recipe] = {"artifact": path, "timings_s": timings}
        if args.evaluate:
            started = time.perf_counter()
            with torch.no_grad():
                logits = torch.export.load(args.model).module()(torch.from_numpy(x_val)).numpy()
            results[recipe]["float_accuracy"] = float(np.mean(np.argmax(logits, 1) == y_val))
            results[recipe]["artifact_accuracy"] = onnx_accuracy(path, x_val, y_val)
            timings["evaluate"] = round(time.perf_counter() - started, 3)
    print(json.dumps(results))


def make_artifact(model_path, recipe, x_train, y_train, example, path):
    model = torch.export.load(model_path).module()
    if recipe == "int8_prune30":
        export_onnx(prune_then_qat(model, x_train, y_train, example), example, path)
        return
    fp32_path = path if recipe == "fp32" else path[:-len(".onnx")] + "_fp32.onnx"
    export_onnx(model, example, fp32_path)
    if recipe == "fp16":
        to_fp16(fp32_path, path)
    elif recipe == "int8":
        quantize_int8(fp32_path, path, x_train, os.path.dirname(path))
    if fp32_path != path:
        os.remove(fp32_path)

if __name__ == "__main__":
    main()
