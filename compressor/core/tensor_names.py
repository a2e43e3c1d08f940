"""Short names for artifact tensors in messages: the layer a tensor belongs to, not the
converter's full name.

Converters name constants after the whole module path (litert-torch:
`pkg.Model/torch.nn.modules.transformer.TransformerEncoder_encoder/...Linear_linear2;1`, often
hundreds of characters), the TensorFlow scope (`model/embedding/embedding_lookup`), or a counter
(`const__2`, `arith.constant13`), for which the op that reads the tensor says more.
"""
from __future__ import annotations

import fnmatch
import re

MAX_CHARS = 60
# counters converters give constants: tf2onnx, the MLIR TFLite converter, torch.onnx, and the
# short hex names of our own saved ONNX files (export/onnx_compact.py)
GENERATED = re.compile(r"^(const(_fold_opt)?_+\d+|arith\.constant\d*|val_\d+|onnx::.*|"
                       r"pseudo_qconst\d*|_v_\d+|[0-9a-f]{1,6})$")
# TensorFlow op scopes, not layers: MatMul_1, BiasAdd, ReadVariableOp, embedding_lookup1
OP_SCOPE = re.compile(r"^([A-Z][A-Za-z0-9]*|[a-z]+(_[a-z]+)*_lookup|perm|transpose|"
                      r"strided_slice)(_?\d+)?$")
VARIABLES = {"kernel", "bias", "weight", "weights", "embeddings", "gamma", "beta", "moving_mean",
             "moving_variance", "depthwise_kernel", "recurrent_kernel"}
WRAPPERS = {"StatefulPartitionedCall", "PartitionedCall"}
# litert-torch path elements: a submodule `torch.nn.modules.linear.Linear_linear2` (-> linear2)
# under the root module `pkg.module.<locals>.Model` (-> Model)
TORCH_MODULE = re.compile(r"^[\w.<>]*\.[A-Z][A-Za-z0-9]*_(\w+)$")
TORCH_ROOT = re.compile(r"^[\w.<>]*\.([A-Z][A-Za-z0-9]*)$")


def short_tensor_name(name: str, reader: str = "") -> str:
    """A tensor's layer name for a message (at most MAX_CHARS). `reader` ("OP_TYPE name" of
    the first op reading it, as inspection records it) names a tensor the converter numbered."""
    if GENERATED.match(name) and reader:
        op, _, where = reader.partition(" ")
        place = short_path(where.removeprefix("node_")) if where else ""
        if not place or place.lower().startswith(op.lower()):
            return _capped(place or op)
        return _capped(f"{op.lower()} in {place}")
    return _capped(short_path(name) or name)


def short_path(name: str) -> str:
    """The layer part of a converter's tensor name ('' when it has none)."""
    parts = [p for p in re.sub(r":\d+$", "", name.split(";")[0]).split("/")
             if p and p not in WRAPPERS]
    if not parts:
        return ""
    modules = [TORCH_MODULE.match(p) for p in parts]
    if any(modules):   # a litert-torch module path: the attribute names, dotted as in PyTorch
        return ".".join(m.group(1) for m in modules if m)
    root = TORCH_ROOT.match(parts[0])
    if len(parts) == 1 and root:
        return root.group(1)
    while len(parts) > 1 and parts[-1] in VARIABLES:
        parts.pop()
    while len(parts) > 2 and OP_SCOPE.match(parts[-1]):
        parts.pop()
    if len(parts) > 1:
        parts = parts[1:]   # the model's own scope comes first: model/dense/MatMul
    return "/".join(parts)


def in_layer(name: str, pattern: str) -> bool:
    """Whether a TensorFlow-named tensor or node (`model/layer/op`, several such paths joined
    by ';' where a converter fused ops: TFLite tensors, tf2onnx nodes) belongs to a layer
    named `pattern` (fnmatch). Layer names may hold '/' themselves (keras.applications'
    MobileNetV3 has a stem "Conv" and nine "expanded_conv_N/squeeze_excite/Conv"), so the
    pattern must match whole parts right after the model's scope: "Conv" is the stem's only."""
    want = pattern.split("/")
    for path in re.sub(r":\d+$", "", name).split(";"):
        parts = [part for part in path.split("/") if part not in WRAPPERS][1:]
        if len(parts) > len(want) and all(
                fnmatch.fnmatchcase(part, wanted) for part, wanted in zip(parts, want)):
            return True
    return False


def _capped(text: str) -> str:
    return text if len(text) <= MAX_CHARS else "..." + text[-(MAX_CHARS - 3):]
