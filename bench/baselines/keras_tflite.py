"""Hand-written baseline: a tf_keras model -> .tflite with tfmot + TFLiteConverter.

What a competent engineer writes directly against the libraries, no toolkit:

    python keras_tflite.py MODEL.keras --recipe fp32|fp16|int8|int8_prune30[,...] \
        --data digits|data.npz --out DIR [--evaluate]

One recipe writes DIR/model.tflite; a comma-separated list writes DIR/RECIPE/model.tflite.

fp32 / fp16: TFLiteConverter (fp16: float16 weights). int8: post-training full-int8 with
256 calibration samples, float I/O. int8_prune30: 30% magnitude pruning (polynomial
schedule, 2 epochs), then prune-preserving QAT (2 epochs), then int8 conversion.
--evaluate prints the float model's and the artifact's val accuracy (tf.lite Interpreter).
"""
import time

T0 = time.perf_counter()   # before the framework imports: timings_s["import"] covers them

import argparse
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras

IMPORT_S = time.perf_counter() - T0

RECIPES = ("fp32", "fp16", "int8", "int8_prune30")

BATCH, LR, EPOCHS, CALIBRATION = 32, 1e-3, 2, 256


def load_data(spec):
    if spec == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        x = (bunch.images / 16.0).astype(np.float32)[..., None]
        y = bunch.target.astype(np.int64)
        x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.25, random_state=0,
                                                          stratify=y)
        return (x_train, y_train), (x_val, y_val)
    with np.load(spec) as npz:
        return (npz["x_train"], npz["y_train"]), (npz["x_val"], npz["y_val"])


def compile_model(model):
    model.compile(optimizer=keras.optimizers.Adam(LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def prune_then_qat(model, x, y, sparsity=0.30):
    import tensorflow_model_optimization as tfmot  # only this recipe needs it (~3 s to import)

    # ramp to full sparsity over all but the last epoch (10 mask updates), then recover
    end_step = int(np.ceil(len(x) / BATCH)) * max(EPOCHS - 1, 1)
    frequency = max(1, end_step // 10)
    schedule = tfmot.sparsity.keras.PolynomialDecay(0.0, sparsity, begin_step=0,
                                                    end_step=frequency * (end_step // frequency),
                                                    frequency=frequency)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    pruned = tfmot.sparsity.keras.prune_low_magnitude(clone, pruning_schedule=schedule)
    compile_model(pruned)
    pruned.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    annotated = tfmot.quantization.keras.quantize_annotate_model(stripped)
    qat = tfmot.quantization.keras.quantize_apply(
        annotated, tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme())
    compile_model(qat)
    qat.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    return qat


def convert(model, recipe, x_train):
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if recipe == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif recipe == "int8":
        def representative():
            for i in range(min(CALIBRATION, len(x_train))):
                yield [x_train[i:i + 1]]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    elif recipe == "int8_prune30":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def tflite_accuracy(path, x, y):
    interpreter = tf.lite.Interpreter(model_path=path)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    interpreter.resize_tensor_input(inp["index"], [len(x), *x.shape[1:]])
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x)
    interpreter.invoke()
    return float(np.mean(np.argmax(interpreter.get_tensor(out["index"]), 1) == y))


def stage(timings, name, lap_start):
    """Record the seconds since `lap_start` under `name`; return the new lap start."""
    timings[name] = round(time.perf_counter() - lap_start, 3)
    return time.perf_counter()


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
    results = {}
    for recipe in recipes:
        timings = {"import": round(IMPORT_S, 3)}
        lap = time.perf_counter()
        keras.utils.set_random_seed(0)
        model = keras.models.load_model(args.model)
        lap = stage(timings, "load", lap)
        if recipe == "int8_prune30":
            model = prune_then_qat(model, x_train, y_train)
            lap = stage(timings, "prune_qat", lap)
        out = args.out if len(recipes) == 1 else os.path.join(args.out, recipe)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "model.tflite")
        with open(path, "wb") as f:
            f.write(convert(model, recipe, x_train))
        lap = stage(timings, "convert", lap)
        results[recipe] = {"artifact": path, "timings_s": timings}
        if args.evaluate:
            original = keras.models.load_model(args.model)
            logits = original.predict(x_val, verbose=0)
            results[recipe]["float_accuracy"] = float(np.mean(np.argmax(logits, 1) == y_val))
            results[recipe]["artifact_accuracy"] = tflite_accuracy(path, x_val, y_val)
            stage(timings, "evaluate", lap)
    print(json.dumps(results))

if __name__ == "__main__":
    main()
