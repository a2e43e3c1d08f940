"""The built-in example data: sklearn's bundled 8x8 digits (`--data digits`)."""
from __future__ import annotations

import numpy as np

from compressor.core.context import Data


def digits(layout: str = "NHWC") -> Data:
    """sklearn's bundled 8x8 digits: 1347 train / 450 val, images / 16 as float32, labels int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y)
    axis = 1 if layout == "NCHW" else -1
    return Data(train=(np.expand_dims(x_train, axis), y_train),
                val=(np.expand_dims(x_val, axis), y_val), name="digits")
