"""How a TFLite file's tensors are named and shaped for inspection: inputs / outputs by
signature name, a FULLY_CONNECTED's rows behind its flattening, and inputs with free dims sized
to one sample of the data (the shapes MACs and activations are counted on)."""
from __future__ import annotations

from typing import Any

import numpy as np

from compressor.runtimes.base import SampleShapes, sample_of


def fully_connected_rows(ops: list, tensors: dict, shapes: dict) -> dict:
    """`shapes` with each FULLY_CONNECTED output as [rows, units]: the op flattens its input
    into rows of the weight's depth, and its stored output shape [-1, units] has -1 standing
    for batch x positions (a Dense on a sequence), not for the batch alone."""
    producer = {out: (op, ins) for op, ins, outs in ops for out in outs}

    def batch1_elements(index: int) -> int | None:
        """Elements of one sample, following RESHAPEs back to a shape known but for the batch."""
        signature = tensors[index]["shape_signature"]
        if all(int(d) > 0 for d in list(signature)[1:]):
            return int(np.prod(shapes[index])) if index in shapes else None
        op, ins = producer.get(index, (None, []))
        return batch1_elements(ins[0]) if op == "RESHAPE" and ins else None

    shapes = dict(shapes)
    for op, ins, outs in ops:
        if op == "FULLY_CONNECTED" and len(ins) > 1 and outs:
            units, depth = (int(d) for d in tensors[ins[1]]["shape"][:2])
            elements = batch1_elements(ins[0])
            if elements is not None:
                shapes[outs[0]] = [elements // max(depth, 1), units]
    return shapes


def sized_to_samples(interp: Any, sample_shapes: SampleShapes | None) -> bool:
    """Resize inputs with free dims to one sample of the data ([1, *sample]) and allocate, so
    every tensor's `shape` is concrete; False (nothing resized) when there is nothing to fix."""
    if not sample_shapes:
        return False
    resized = False
    details, names = signature_ordered(interp, interp.get_input_details(), "inputs")
    for detail, name in zip(details, names):
        signature = list(detail["shape_signature"])
        sample = sample_of(sample_shapes, name, len(details) == 1)
        if sample is None or all(int(d) > 0 for d in signature[1:]) \
                or len(sample) != len(signature) - 1:
            continue
        interp.resize_tensor_input(detail["index"], [1, *(int(d) for d in sample)])
        resized = True
    if resized:
        try:
            interp.allocate_tensors()
        except (ValueError, RuntimeError):
            return False
    return resized


def signature_ordered(interp, details: list[dict], side: str) -> tuple[list[dict], list[str]]:
    """Tensor details ordered by tensor index, named by the serving signature (`image`,
    `input_ids`, `cls`); the tensor names themselves when the file has no single signature.

    The names are what callers match outputs by: the order is only litert-torch's model order
    (it assigns indices in argument / output order). The TensorFlow converter's indices, and
    the signature (LiteRT lists it sorted by name), can run opposite to a Keras model's
    outputs, so validation pairs outputs with the original model's by name."""
    signatures = interp._get_full_signature_list() or {}
    if len(signatures) != 1:
        return details, [d["name"] for d in details]
    by_index = {index: name for name, index in next(iter(signatures.values()))[side].items()}
    ordered = sorted(details, key=lambda d: d["index"])
    if set(by_index) != {d["index"] for d in ordered}:
        return details, [d["name"] for d in details]
    return ordered, [by_index[d["index"]] for d in ordered]
