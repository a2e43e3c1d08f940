"""When is a model's first quantized tensor a narrow band? Shared by the int8 routes that fold
in-model input preprocessing into the first convs (export/onnx_input_fold.py for ONNX,
backends/keras/input_fold.py for TFLite).

keras.applications nets fed [0, 1] images (their Rescaling expects [0, 255]) leave the
typical channel of the preprocessed image at 0.008 of the range a uint8 / int8 scale must
cover; fed the [0, 255] they expect, 0.9+. Folding only below NARROW_INPUT keeps well-spread
inputs as they were: there the fold's border map costs one more rounding (EfficientNetV2B0,
[0, 255], ONNX: max softmax diff 0.140 -> 0.266).
"""
from __future__ import annotations

import numpy as np

NARROW_INPUT = 1 / 16   # 16 of 256 levels


def narrow_span(values: np.ndarray, channel_axis: int = 1) -> float:
    """Median over channels of a channel's span, as a fraction of the range a per-tensor
    8-bit scale must cover (zero included): 1/128 is 2 of 256 levels."""
    channels = np.moveaxis(values, channel_axis, 0).reshape(values.shape[channel_axis], -1)
    covered = max(float(values.max()), 0.0) - min(float(values.min()), 0.0)
    spans = channels.max(axis=1) - channels.min(axis=1)
    return float(np.median(spans)) / covered if covered > 0 else 1.0


def is_narrow(values: np.ndarray, channel_axis: int = 1) -> bool:
    return narrow_span(values, channel_axis) < NARROW_INPUT


def channel_constants(image: np.ndarray, channel_axis: int) -> np.ndarray | None:
    """One image's value per channel where every channel holds a single value (what an
    affine preprocessing makes of a constant image), else None."""
    flat = np.moveaxis(image, channel_axis, 0).reshape(image.shape[channel_axis], -1)
    if np.abs(flat - flat[:, :1]).max() > 1e-6 * max(np.abs(flat).max(), 1.0):
        return None
    return flat[:, 0].astype(np.float64)
