"""Build, train and save the bench's models (run as a subprocess, one per framework).

    python -m bench.prepare keras|torch OUT_DIR

Keras nets go to NAME.keras; PyTorch nets to NAME.pt2 (torch.export, dynamic batch) and
NAME.pt (state_dict). The 32x32 net's random data goes to conv32_{nhwc,nchw}.npz, labelled
with the float model's own predictions (so "accuracy" there is top-1 agreement with fp32).
A manifest records what was built; files whose spec is unchanged are not rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.nets import DIGITS, NETS, NetSpec, build_keras, build_torch

KERAS_NETS = ("digits", "conv32", "conv1m", "scale_0.1m", "scale_1m", "scale_10m")
TORCH_NETS = ("digits", "conv32", "conv1m")
TORCH_TRAINED = ("digits",)       # the PyTorch 1M / 32x32 nets are only timed: untrained
RANDOM_TRAIN, RANDOM_VAL = 256, 64


def spec_hash(spec: NetSpec, framework: str) -> str:
    text = repr((spec, framework, spec.name in TORCH_TRAINED, RANDOM_TRAIN, RANDOM_VAL, 2))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digits_split(layout: str):
    from compressor.tasks.array.data import digits

    data = digits(layout)
    return data.train, data.val


def random_split(spec: NetSpec, layout: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (spec.input_hw, spec.input_hw, spec.in_channels)
    x = rng.random((RANDOM_TRAIN + RANDOM_VAL, *shape), dtype=np.float32)
    if layout == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x[:RANDOM_TRAIN], x[RANDOM_TRAIN:]


def save_random_npz(path: Path, x_train, x_val, predict) -> None:
    np.savez(path, x_train=x_train, y_train=np.argmax(predict(x_train), 1).astype(np.int64),
             x_val=x_val, y_val=np.argmax(predict(x_val), 1).astype(np.int64))


def prepare_keras(name: str, out: Path) -> dict:
    spec = NETS[name]
    path = out / f"{name}.keras"
    if name == "digits":
        from compressor.backends.examples import save_keras_digits_cnn

        save_keras_digits_cnn(path, epochs=DIGITS.train_epochs)
        return {"model": str(path)}
    model = build_keras(spec)
    if spec.train_epochs:
        import tf_keras as keras

        (x, y), _ = digits_split("NHWC")
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=spec.train_epochs, batch_size=32, verbose=0)
    model.save(path)
    entry = {"model": str(path)}
    if spec.data == "random":
        x_train, x_val = random_split(spec, "NHWC")
        entry["data"] = str(out / f"{name}_nhwc.npz")
        save_random_npz(Path(entry["data"]), x_train, x_val, lambda x: model.predict(x, verbose=0))
    return entry


def train_torch(model, epochs: int, seed: int = 0) -> None:
    import torch

    torch.manual_seed(seed)
    (x, y), _ = digits_split("NCHW")
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for lo in range(0, len(x), 32):
            idx = order[lo:lo + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()


def prepare_torch(name: str, out: Path) -> dict:
    import torch

    spec = NETS[name]
    model = build_torch(spec)
    if name in TORCH_TRAINED:
        train_torch(model, spec.train_epochs)
    model.eval()
    example = torch.zeros(2, spec.in_channels, spec.input_hw, spec.input_hw)
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    entry = {"model": str(out / f"{name}.pt2"), "weights": str(out / f"{name}.pt"),
             "function": f"bench.nets:torch_{name}"}
    torch.export.save(program, entry["model"])
    torch.save(model.state_dict(), entry["weights"])
    if spec.data == "random":
        x_train, x_val = random_split(spec, "NCHW")
        entry["data"] = str(out / f"{name}_nchw.npz")

        def predict(x):
            with torch.no_grad():
                return model(torch.from_numpy(x)).numpy()

        save_random_npz(Path(entry["data"]), x_train, x_val, predict)
    return entry


def main(framework: str, out: Path) -> dict:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / f"manifest_{framework}.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    names, build = (KERAS_NETS, prepare_keras) if framework == "keras" else (TORCH_NETS, prepare_torch)
    for name in names:
        key = spec_hash(NETS[name], framework)
        old = manifest.get(name, {})
        if old.get("hash") == key and all(Path(p).exists() for k, p in old.items()
                                          if k in ("model", "weights", "data")):
            continue
        started = time.perf_counter()
        entry = build(name, out)
        entry.update(hash=key, params=NETS[name].params(), build_s=round(time.perf_counter() - started, 2))
        manifest[name] = entry
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
