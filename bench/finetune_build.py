"""The issue-15 cases' measurements in one framework's process (python -m bench.finetune_build
CASE FRAMEWORK); the last stdout line is the JSON result.

- kd_gain: the acceptance scenario of tests/test_distill_gain.py through the whole pipeline
  (cz.compress, default built-in recipes, val accuracy of the exported artifact): a digits
  teacher CNN (~38k parameters), students of ~7.7k trained 1 epoch ("brief") or 20 epochs
  ("converged") from scratch, seeds 0-2; int8_prune30 vs int8_prune30_kd.
- pretrained_drop: a ResNet-style (BatchNorm, skip Adds) and a MobileNetV2-style (depthwise,
  ReLU6, inverted residuals) net, the zoo's block lists shrunk to 8x8 digits, trained to high
  accuracy once; default int8_prune30 and int8_qat, each run with seeds 0-2 (fine-tuning
  order, pruning); the drop = trained float accuracy - artifact's, judged on its mean over the
  seeds (one image of the 450 is 0.22 pt: one seed's drop is mostly noise).

One export format per framework (Keras tflite, PyTorch onnx: each backend's native route)
keeps the case in minutes; the recipes' steps and gates are the built-in defaults.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SEEDS = (0, 1, 2)
STUDENT_SHAPE = {"filters": (8, 16), "dense": 24}
SCENARIOS = {"brief": 1, "converged": 20}        # student training epochs from scratch
FORMAT = {"keras": "tflite", "torch": "onnx"}
PRETRAINED_EPOCHS = 30
NETS = {   # the zoo's families at digits scale: (name, activation, stem, blocks)
    "resnet_digits": ("resnet_digits", "relu", 16, [("basic", 16, 1), ("basic", 32, 2),
                                                     ("basic", 32, 1)]),
    "mobilenetv2_digits": ("mobilenetv2_digits", "relu6", 16, [
        ("mb", 16, 1, 1, 3, False), ("mb", 24, 2, 6, 3, False), ("mb", 24, 1, 6, 3, False)]),
}


def _layout(framework: str) -> str:
    return "NCHW" if framework == "torch" else "NHWC"


def _accuracy(framework: str, model, data) -> float:
    from compressor.backends import get_backend

    outputs = get_backend(framework).predict(model, data.val[0])
    return float(np.mean(np.argmax(outputs, -1) == data.val[1]))


def _compress(model, recipe: str, framework: str, data, teacher=None, seed: int = 0) -> dict:
    import compressor as cz
    from compressor.config.recipe import load_recipe

    chosen = load_recipe(recipe).model_copy(update={"export": (FORMAT[framework],)})
    with tempfile.TemporaryDirectory() as folder:
        result = cz.compress(model, chosen, data=data, teacher=teacher, quiet=True,
                             latency=False, out_dir=Path(folder) / "out", seed=seed)
    row = result.report["artifacts"][0]
    return {"accuracy": row.get("metric_value"), "passed": result.passed}


def kd_gain(framework: str) -> dict:
    from compressor.backends import examples
    from compressor.tasks.array.data import digits

    data = digits(_layout(framework))
    train = examples.train_torch_digits_cnn if framework == "torch" else \
        examples.train_keras_digits_cnn
    teacher = train(epochs=8)
    rows = []
    for scenario, epochs in SCENARIOS.items():
        for seed in SEEDS:
            student = train(epochs=epochs, seed=seed, **STUDENT_SHAPE)
            row = {"scenario": scenario, "seed": seed, "student": _accuracy(framework, student, data)}
            for recipe in ("int8_prune30", "int8_prune30_kd"):
                row[recipe] = _compress(student, recipe, framework, data,
                                        teacher if recipe.endswith("_kd") else None)["accuracy"]
            rows.append(row)
    summary = {}
    for scenario in SCENARIOS:
        chosen = [r for r in rows if r["scenario"] == scenario]
        means = {k: round(float(np.mean([r[k] for r in chosen])), 4)
                 for k in ("student", "int8_prune30", "int8_prune30_kd")}
        summary[scenario] = {**means, "kd_gain": round(means["int8_prune30_kd"]
                                                       - means["int8_prune30"], 4)}
    return {"teacher": _accuracy(framework, teacher, data), "rows": rows, "summary": summary}


def _pretrained(framework: str, spec: tuple, data):
    from bench import zoo_nets
    from compressor.backends import examples

    if framework == "torch":
        model = zoo_nets.build_torch(spec, in_channels=1)
        return examples.train_torch_classifier(model, *data.train, epochs=PRETRAINED_EPOCHS,
                                               lr=3e-3)
    import tf_keras as keras

    model = zoo_nets.build_keras(spec, input_hw=8, in_channels=1)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(*data.train, epochs=PRETRAINED_EPOCHS, batch_size=32, verbose=0)
    return model


def pretrained_drop(framework: str) -> dict:
    from compressor.tasks.array.data import digits

    data = digits(_layout(framework))
    rows = []
    for name, spec in NETS.items():
        model = _pretrained(framework, spec, data)
        trained = _accuracy(framework, model, data)
        for recipe in ("int8_prune30", "int8_qat"):
            seeds = []
            for seed in SEEDS:
                started = time.perf_counter()
                outcome = _compress(model, recipe, framework, data, seed=seed)
                seeds.append({"seed": seed, "artifact": outcome["accuracy"],
                              "passed": outcome["passed"],
                              "drop": round(trained - outcome["accuracy"], 4),
                              "wall_s": round(time.perf_counter() - started, 1)})
            rows.append({"net": name, "recipe": recipe, "trained": round(trained, 4),
                         "artifact": round(float(np.mean([s["artifact"] for s in seeds])), 4),
                         "drop": round(float(np.mean([s["drop"] for s in seeds])), 4),
                         "passed": sum(s["passed"] for s in seeds), "seeds": seeds})
    return {"rows": rows}


def main(case: str, framework: str) -> int:
    result = {"kd_gain": kd_gain, "pretrained_drop": pretrained_drop}[case](framework)
    print(json.dumps({"framework": framework, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
