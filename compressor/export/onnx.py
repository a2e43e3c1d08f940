"""ONNX graph work every exporter shares: checked saves, float16 conversion, and matching
`exclude` patterns to nodes (Keras layer names, PyTorch module paths, node names)."""
from __future__ import annotations

import copy
import fnmatch
from pathlib import Path
from typing import Any

from compressor.errors import BackendUnavailableError, RecipeError, first_line
from compressor.export.onnx_compact import compact
from compressor.core.tensor_names import in_layer


def save_checked_onnx(proto: Any, path: Path, log: Path) -> Path:
    """onnx.checker first, so an invalid graph is a typed error and never written."""
    import onnx

    compact(proto)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise BackendUnavailableError(f"the exported ONNX model is invalid ({first_line(exc)}); "
                                      f"see {log}, or export tflite only") from None
    onnx.save(proto, str(path))
    return path


def float16_onnx(proto: Any, precision: Any) -> Any:
    """float16 weights (onnxruntime's transformer tools' converter, which unlike
    onnxconverter-common 1.16 keeps Gather / Where chains of attention models type-consistent),
    float32 I/O by default; nodes of `exclude`d layers keep float32 weights."""
    from onnxruntime.transformers import float16

    from compressor.export.onnx_input_fold import fold_input_affine

    # Input preprocessing on images it does not expect leaves a narrow band far from zero,
    # which float16 rounds away (EfficientNetV2B0 fed [0, 1] images: accuracy 0.951 -> 0.963
    # = float32 with the fold, max softmax diff 0.206 -> 0.014): onnx_input_fold.py
    fold_input_affine(proto)
    matched = {pattern: [node.name for node in proto.graph.node if names_layer(node, pattern)]
               for pattern in precision.exclude}
    unmatched = [pattern for pattern, nodes in matched.items() if not nodes]
    if unmatched:
        raise RecipeError(f"precision exclude pattern(s) {', '.join(map(repr, unmatched))} match "
                          "no node of the ONNX model; patterns match layer names (e.g. "
                          "'dense_1', 'conv*'), PyTorch module paths ('head.3') or node names")
    blocked = sorted({name for nodes in matched.values() for name in nodes})
    # Copies of the float32 weights before conversion, for the excluded layers (see below).
    originals = {init.name: copy.deepcopy(init) for init in proto.graph.initializer} \
        if blocked else {}
    # The converter keeps its default op block list (ops without float16 kernels) too.
    converted = float16.convert_float_to_float16(proto, keep_io_types=precision.keep_io_types,
                                                 node_block_list=blocked or None)
    if blocked:
        from compressor.export.onnx_mixed import restore_float32_weights

        restore_float32_weights(converted, originals, set(blocked))
    _casts_match_their_outputs(converted)
    from onnxruntime.transformers.onnx_model import OnnxModel

    OnnxModel(converted).topological_sort()   # the input Casts it adds come after their users
    return converted


def _casts_match_their_outputs(proto: Any) -> None:
    """onnxconverter-common types the output of a Cast to float32 that feeds float16 ops as
    float16 but leaves the Cast's `to` at float32 (tf2onnx's LayerNormalization divides by a
    Cast element count): onnxruntime refuses that graph. Such a Cast now casts to float16."""
    from onnx import TensorProto

    declared = {value.name: value.type.tensor_type.elem_type
                for value in (*proto.graph.value_info, *proto.graph.output)}
    for node in proto.graph.node:
        if node.op_type != "Cast" or declared.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16


def names_layer(node: Any, pattern: str) -> bool:
    """A node belongs to a layer if its whole name matches; or, named by torch.onnx
    ('/head/head.3/Gemm', each part a whole module path), if a part matches or a module path
    torch.onnx recorded for it (e.g. 'head.3'); or, named by tf2onnx (`model/layer/op`), if
    its layer part does (tensor_names.in_layer: Keras layer names may hold '/')."""
    import ast

    if fnmatch.fnmatch(node.name, pattern):
        return True
    scopes = [str(scope) for prop in node.metadata_props
              if prop.key == "pkg.torch.onnx.name_scopes" and prop.value.startswith("[")
              for scope in ast.literal_eval(prop.value)]
    if scopes or node.name.startswith("/"):
        return any(fnmatch.fnmatch(p, pattern) for p in [*node.name.split("/"), *scopes])
    return in_layer(node.name, pattern)


def require_dynamic_batch(proto: Any) -> None:
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            raise BackendUnavailableError(f"the ONNX input {value.name!r} has a fixed batch size "
                                          f"{dims[0].dim_value}; give the model a None batch "
                                          "dimension (keras.Input(shape=...)) and export again")


def renamed_io(proto: Any, names: dict[str, str]) -> None:
    """Rename graph inputs / outputs (old -> new) everywhere they are used, in place."""
    names = {old: new for old, new in names.items() if old != new}
    if not names:
        return
    for value in (*proto.graph.input, *proto.graph.output):
        value.name = names.get(value.name, value.name)
    for node in proto.graph.node:
        node.input[:] = [names.get(name, name) for name in node.input]
        node.output[:] = [names.get(name, name) for name in node.output]
