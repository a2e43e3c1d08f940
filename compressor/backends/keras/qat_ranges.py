"""The activation ranges a tfmot QAT model learned, for the int8 ONNX of its float layers
(export/onnx_ranges.py says why and how they are matched to the ONNX graph).

tfmot keeps each range as a pair of variables in the layer's quantize wrapper: the output of a
layer (`output_min` / `output_max`), the output after its own activation
(`post_activation_min` / `_max`), and the model input in the QuantizeLayer after it
(`quantize_layer_min` / `_max`). Each is paired with the value of the same tensor in the
float model on a few training inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.backends.keras.env import fake_quant_layer_types, import_tf_keras
from compressor.export.onnx_ranges import MATCH_ROWS, LearnedRange, LearnedRanges

OUTPUT_RANGES = ("post_activation", "output")


def learned_ranges(qat_model: Any, float_model: Any, inputs: dict[str, np.ndarray]) -> LearnedRanges:
    """The ranges of `qat_model` with their tensors' values in `float_model` (its float
    layers, same layer names) on the first MATCH_ROWS rows of `inputs` (input name -> rows)."""
    tf_keras = import_tf_keras()
    wrappers, input_quantizer = fake_quant_layer_types()
    feed = {name: array[:MATCH_ROWS] for name, array in inputs.items()}
    ranges, layers = [], []
    for layer in qat_model.layers:
        if isinstance(layer, input_quantizer):
            low, high = _pair(layer, "quantize_layer")
            source = layer.inbound_nodes[0].inbound_layers
            if low is not None and source.name in feed:
                ranges.append(LearnedRange(feed[source.name], low, high))
        elif isinstance(layer, wrappers):
            for kind in OUTPUT_RANGES:
                low, high = _pair(layer, kind)
                if low is not None:
                    layers.append((layer.layer.name, low, high))
                    break
    names = {layer.name for layer in float_model.layers}
    layers = [entry for entry in layers if entry[0] in names]
    if layers:
        probe = tf_keras.Model(float_model.inputs,
                               [float_model.get_layer(name).output for name, _, _ in layers])
        arrays = [feed[name] for name in float_model.input_names]
        values = probe(arrays[0] if len(arrays) == 1 else arrays, training=False)
        values = values if isinstance(values, (list, tuple)) else [values]
        ranges += [LearnedRange(np.asarray(value), low, high)
                   for value, (_, low, high) in zip(values, layers)]
    return LearnedRanges(feed, tuple(ranges))


def _pair(layer: Any, kind: str) -> tuple[float | None, float | None]:
    """The layer's `<kind>_min` / `<kind>_max` variables, as numbers."""
    found = {weight.name.split("/")[-1].split(":")[0]: weight for weight in layer.weights}
    low, high = found.get(f"{kind}_min"), found.get(f"{kind}_max")
    if low is None or high is None or low.shape.rank or high.shape.rank:
        return None, None
    return float(low.numpy()), float(high.numpy())
