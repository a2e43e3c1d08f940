"""Small example models trained on the built-in digits data, for `make demo` and the tests.

They are real trained models (a few seconds on a CPU), so every number the demo prints is
measured, not canned.
"""
from __future__ import annotations

import os
from pathlib import Path


def keras_digits_cnn(filters: tuple[int, int] = (16, 32), dense: int = 64):
    """An untrained tf_keras CNN for (8, 8, 1) digits images with 10 logits."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()   # quiet, Keras-2 configured import

    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(filters[0], 3, padding="same", activation="relu"),
        keras.layers.Conv2D(filters[1], 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(dense, activation="relu"),
        keras.layers.Dense(10),
    ], name="digits_cnn")


def train_keras_digits_cnn(epochs: int = 8, seed: int = 0, **shape):
    """A trained digits CNN (about 0.97-0.99 val accuracy after 8 epochs, ~5 s on 2 cores)."""
    from compressor.backends.keras.env import import_tf_keras

    keras = import_tf_keras()

    from compressor.core.datasets import digits

    keras.utils.set_random_seed(seed)
    data = digits("NHWC")
    model = keras_digits_cnn(**shape)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(*data.train, epochs=epochs, batch_size=32, verbose=0)
    return model


def save_keras_digits_cnn(path: Path, epochs: int = 8, seed: int = 0) -> Path:
    model = train_keras_digits_cnn(epochs=epochs, seed=seed)
    model.save(path)
    return path


def torch_digits_cnn(filters: tuple[int, int] = (16, 32), dense: int = 64, seed: int = 0):
    """An untrained torch CNN for (N, 1, 8, 8) digits images with 10 logits (~39k params)."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, filters[0], 3, padding=1), nn.ReLU(),
        nn.Conv2d(filters[0], filters[1], 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(filters[1] * 16, dense), nn.ReLU(),
        nn.Linear(dense, 10))


def train_torch_digits_cnn(epochs: int = 8, seed: int = 0, lr: float = 3e-3, **shape):
    """A trained torch digits CNN (plain Adam + cross-entropy loop, a few seconds)."""
    from compressor.core.datasets import digits

    model = torch_digits_cnn(seed=seed, **shape)
    return train_torch_classifier(model, *digits("NCHW").train, epochs=epochs, lr=lr, seed=seed)


def train_torch_classifier(model, x, y, epochs: int = 8, lr: float = 3e-3, seed: int = 0,
                           cosine: bool = False):
    """Plain Adam + cross-entropy, batches of 32, in place; returns the model in eval mode.
    `cosine`: the rate decays to 0 along a cosine over the whole run (else constant)."""
    import math

    import numpy as np
    import torch

    torch.manual_seed(seed)
    x, y = (torch.from_numpy(np.asarray(a)) for a in (x, y))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * math.ceil(len(x) / 32)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps) if cosine else None
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 32):
            batch = order[start:start + 32]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    return model.eval()
