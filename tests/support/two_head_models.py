"""A two-input, two-output tf_keras Functional model whose outputs are listed `cls` first,
`aux` second (issue 27): only `cls` is trained, so scoring the wrong head shows (aux is at
chance). The TensorFlow converter gives `aux` the lower TFLite tensor index."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compressor.core.context import Data

ROWS, TRAIN = 400, 300


def two_head_data(seed: int = 0) -> Data:
    """x (N, 8) and meta (N, 2) float32; the label (4 classes) is the signs of x0 and meta0."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    meta = rng.normal(size=(ROWS, 2)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + 2 * (meta[:, 0] > 0)).astype(np.int64)
    return Data(train=({"x": x[:TRAIN], "meta": meta[:TRAIN]}, y[:TRAIN]),
                val=({"x": x[TRAIN:], "meta": meta[TRAIN:]}, y[TRAIN:]), name="two-head")


def two_head_keras(data: Data, epochs: int = 60) -> Any:
    """Inputs x, meta; outputs [cls, aux], both (N, 4); aux is left untrained."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()
    keras.utils.set_random_seed(0)
    x, meta = keras.Input((8,), name="x"), keras.Input((2,), name="meta")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([x, meta]))
    model = keras.Model([x, meta], [keras.layers.Dense(4, name="cls")(hidden),
                                    keras.layers.Dense(4, name="aux")(hidden)])
    model.compile(keras.optimizers.Adam(0.01),
                  loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), None])
    inputs, labels = data.train
    model.fit([inputs["x"], inputs["meta"]], labels, epochs=epochs, batch_size=64, verbose=0)
    return model


def save_npz(data: Data, path: Path) -> Path:
    """The data as `compress --data` reads it: x_train.<name> / x_val.<name> keys."""
    (x, y), (xv, yv) = data.train, data.val
    np.savez(path, **{f"x_train.{k}": v for k, v in x.items()}, y_train=y,
             **{f"x_val.{k}": v for k, v in xv.items()}, y_val=yv)
    return path
