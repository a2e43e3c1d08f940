"""Finish the builder's model.onnx in place: the embedding lookup reads our integers
(GatherBlockQuantized), and the rotary tables are cut to the run's context.

What the builder (0.18.0) writes for the embedding, and what we do with it:
- tied, int4 / int8 (we build at -p int4 whatever the checkpoint's bits: at -p int8 the lookup
  would be a float copy): a GatherBlockQuantized sharing the lm_head's MatMulNBits tensors, but
  with the 1-D scales / zero points MatMulNBits takes, which fails its shape inference
  ("scales must have the same rank as data"): reshape those initializers to [N, blocks] and
  [N, ceil(blocks * bits / 8)] (MatMulNBits accepts the 2-D form too).
- untied, embedding in LoadedLm.quantized: the builder keeps it float32 (it does not quantize
  a Gather of a pre-quantized checkpoint): replaced by a GatherBlockQuantized over our packed
  integers (the MatMulNBits layout).
Symmetric integers (the int4 default): every zero point is the grid's middle (8 at 4 bits, 128
at 8), which is what MatMulNBits and GatherBlockQuantized assume without one, so the zero-point
tensors the GPTQ checkpoint brought go (4 bits per group of 32: 2.4% of the int4 bytes).
cos_cache / sin_cache hold max_position_embeddings rows; positions past the KV cache's
length never occur, so rows past `context` go (Llama 3's 131072 x 64 float32 tables are 64 MB).
When a tensor goes or shrinks, model.onnx.data is written again, one tensor at a time.
"""
from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

from compressor.backends.llm.gptq_format import input_embedding_name

EMBED = "/model/embed_tokens"
DATA_FILE = "model.onnx.data"
EXTERNAL_BYTES = 1024   # tensors this large live in the data file (onnx's default threshold)
ROTARY_TABLES = ("cos_cache", "sin_cache")


def finish_graph(model_path: Path, loaded: Any, context: int) -> None:
    import onnx

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    if loaded.quantized:
        _check_integers_are_ours(model)
    dropped = {_finish_embedding(model, loaded)} - {None}
    if loaded.quantized and all(_symmetric(w) for w in loaded.quantized.values()):
        dropped |= _drop_zero_points(model)
    trimmed = [t for t in model.graph.initializer
               if t.name.startswith(ROTARY_TABLES) and t.dims and t.dims[0] > context]
    if not dropped and not trimmed:
        onnx.save(model, str(model_path))
        return
    _rewrite(model, model_path, dropped, {t.name for t in trimmed}, context)


def _symmetric(weight) -> bool:
    return bool((weight.zeros == 2 ** (weight.bits - 1)).all())


def _drop_zero_points(model) -> set[str]:
    """Remove the zero-point input of every MatMulNBits / GatherBlockQuantized (all our weights
    are symmetric: each zero point is the default); returns the initializers no longer read."""
    dropped = set()
    for node in model.graph.node:
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized") and len(node.input) > 3:
            dropped.add(node.input[3])
            kept = list(node.input[:3]) + ([""] if len(node.input) > 4 else []) + list(node.input[4:])
            del node.input[:]
            node.input.extend(kept)
    still_read = {name for node in model.graph.node for name in node.input}
    return {name for name in dropped if name and name not in still_read}


def _check_integers_are_ours(model) -> None:
    """Every MatMul a GPTQ checkpoint feeds is MatMulNBits from our tensors; a float MatMul or
    one the builder's own quantizer rounded (named *_Q4 / *_Q8) means a weight missed the
    checkpoint (a bug: the artifact would not hold the recipe's integers)."""
    weights = {t.name for t in model.graph.initializer}
    rounded = [n.name for n in model.graph.node
               if (n.op_type == "MatMul" and n.input[1] in weights)
               or (n.op_type == "MatMulNBits" and n.name.endswith(("_Q4", "_Q8")))]
    if rounded:
        raise RuntimeError(f"the builder quantized {rounded[:3]} itself: those weights were "
                           "not in the GPTQ checkpoint")


def _finish_embedding(model, loaded: Any) -> str | None:
    """Edit the embedding lookup; returns the float table it no longer reads, if any."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    node = next((n for n in graph.node if n.name.startswith(EMBED + "/Gather")), None)
    if node is None:
        return None
    if node.op_type == "GatherBlockQuantized":
        _two_d_scales(node, _matmul_nbits_of(graph, node.input[2]), inits)
        return None
    table = node.input[0]
    if table not in inits:
        return None   # tied float: a Transpose of the lm_head weight, already one copy
    embed_name = input_embedding_name(loaded.model)
    tied = bool(getattr(loaded.config, "tie_word_embeddings", False))
    if tied or embed_name not in loaded.quantized:
        return None   # a float model, or a float table the builder chose to keep
    _gather_from_ours(model, node, loaded.quantized[embed_name])
    return table


def _two_d_scales(gather, matmul, inits: dict) -> None:
    """Scales [N, blocks] and zero points [N, ceil(blocks * bits / 8)] for GatherBlockQuantized."""
    if matmul is None:
        return
    n = _attr(matmul, "N")
    bits = _attr(matmul, "bits")
    scales = inits[gather.input[2]]
    blocks = int(np.prod(scales.dims)) // n
    del scales.dims[:]
    scales.dims.extend([n, blocks])
    if len(gather.input) > 3 and gather.input[3] in inits:
        zeros = inits[gather.input[3]]
        del zeros.dims[:]
        zeros.dims.extend([n, (blocks * bits + 7) // 8])


def _gather_from_ours(model, gather, weight) -> None:
    """GatherBlockQuantized over `weight`'s integers, packed as MatMulNBits packs B."""
    import onnx

    data, scales, zeros = pack_rows(weight)
    base = "model.embed_tokens.qweight"
    names = [base, base.replace("qweight", "scales"), base.replace("qweight", "qzeros")]
    for name, value in zip(names, (data, scales, zeros)):
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    inputs = [names[0], gather.input[1], names[1], names[2]]
    _replace(model, gather, [_gbq(inputs, gather.output[0], weight.bits, weight.group_size)])


def pack_rows(weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data uint8 [N, K*bits/8], scales float32 [N, K/g], zero points uint8 [N, ceil(K/g*bits/8)]):
    4-bit values two per byte, the lower index in the low nibble (QuantizedLinear.packed is
    already that layout)."""
    zeros = weight.zeros.numpy().astype(np.uint8)
    if weight.bits == 4:
        zeros = _nibbles(zeros)
    return (np.ascontiguousarray(weight.packed.numpy()),
            np.ascontiguousarray(weight.scales.numpy().astype(np.float32)),
            np.ascontiguousarray(zeros))


def _nibbles(values: np.ndarray) -> np.ndarray:
    if values.shape[1] % 2:
        values = np.pad(values, ((0, 0), (0, 1)))
    return (values[:, 0::2] & 0xF) | ((values[:, 1::2] & 0xF) << 4)


def _gbq(inputs: list[str], output: str, bits: int, block: int):
    import onnx

    return onnx.helper.make_node("GatherBlockQuantized", inputs, [output],
                                 name=f"{EMBED}/GatherBlockQuantized", domain="com.microsoft",
                                 bits=bits, block_size=block, gather_axis=0, quantize_axis=1)


def _replace(model, old, new: list) -> None:
    nodes = list(model.graph.node)
    index = nodes.index(old)
    nodes[index:index + 1] = new
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _rewrite(model, model_path: Path, dropped: set[str], trimmed: set[str],
             context: int) -> None:
    """Drop / trim initializers and write model.onnx + model.onnx.data again."""
    import onnx

    kept = [t for t in model.graph.initializer if t.name not in dropped]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)

    def trim(tensor) -> None:
        if tensor.name in trimmed:
            rows = onnx.numpy_helper.to_array(tensor)[:context]
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(rows), tensor.name))

    stream_rewrite(model, model_path, trim)


def stream_rewrite(model, model_path: Path, change: Callable[[Any], None]) -> None:
    """Write model.onnx.data anew one initializer at a time (`change(tensor)` edits each in
    place first), then model.onnx: memory holds one tensor's data, not the model's."""
    import onnx
    from onnx.external_data_helper import (load_external_data_for_tensor, set_external_data,
                                           uses_external_data)

    folder = Path(model_path).parent
    fresh = folder / (DATA_FILE + ".new")
    with open(fresh, "wb") as sink:
        for tensor in model.graph.initializer:
            # each tensor's bytes in a message of its own, freed after it: bytes cleared in
            # a field of the model's message stay in its memory until the whole model goes
            work = onnx.TensorProto()
            work.CopyFrom(tensor)
            if uses_external_data(work):
                load_external_data_for_tensor(work, str(folder))   # from the old data file
                work.data_location = onnx.TensorProto.DEFAULT
                del work.external_data[:]
            change(work)
            if not work.HasField("raw_data"):
                work.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(work),
                                                           work.name))
            if len(work.raw_data) >= EXTERNAL_BYTES:
                offset = sink.tell()
                sink.write(work.raw_data)
                set_external_data(work, DATA_FILE, offset, len(work.raw_data))
                work.ClearField("raw_data")
            tensor.CopyFrom(work)
    os.replace(fresh, folder / DATA_FILE)
    onnx.save(model, str(model_path))


def _matmul_nbits_of(graph, scales_name: str):
    return next((n for n in graph.node if n.op_type == "MatMulNBits" and n.input[2] == scales_name),
                None)


def _attr(node, name: str) -> int:
    return next(a.i for a in node.attribute if a.name == name)

