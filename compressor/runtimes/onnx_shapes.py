"""The shape of every value of an ONNX graph for one sample, the shapes its MACs and
activation bytes are counted on.

onnxruntime's symbolic shape inference follows the Shape -> Reshape arithmetic of exported
attention blocks, where onnx's own inference loses the batch dim; it stops, though, at the
first op it has no rule for, and a file onnxruntime saved after optimizing (or its
transformers optimizer wrote) is full of such ops: DynamicQuantizeMatMul,
MatMulIntegerToFloat, FusedMatMul, FusedGemm, FusedConv, QGemm, QAttention,
QEmbedLayerNormalization. `_ContribShapes`
adds rules for those, so every MatMul after them keeps its shape (and its MACs).
"""
from __future__ import annotations

import contextlib
import tempfile

from compressor.runtimes.base import SampleShapes, sample_of


def dims_of(type_proto) -> list[int] | None:
    """Shape with -1 for symbolic or unknown dimensions; None when even the rank is unknown."""
    if not type_proto.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else -1 for d in type_proto.tensor_type.shape.dim]


def batch1_shapes(model, sample_shapes: SampleShapes | None = None
                  ) -> dict[str, tuple[list[int] | None, int]]:
    """name -> (shape, onnx elem type) of every value, for one sample: the batch dim set to 1
    and other free input dims to `sample_shapes` (input name -> one sample's shape, from the
    data). Symbolic shape inference first (with rules for onnxruntime's fused ops), onnx's
    own inference as the fallback."""
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())   # inference must not touch the caller's copy
    initializers = {t.name for t in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    for value in inputs:
        sample = sample_of(sample_shapes, value.name, len(inputs) == 1)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            if axis == 0:
                dim.dim_value = 1
            elif sample is not None and axis - 1 < len(sample):
                dim.dim_value = int(sample[axis - 1])
    model = _inferred(model)
    values = [*model.graph.input, *model.graph.value_info, *model.graph.output]
    return {v.name: (dims_of(v.type), v.type.tensor_type.elem_type) for v in values}


def _inferred(model):
    import onnx

    try:
        # The stock class, when it cannot infer every shape, saves the model into the working
        # directory (sym_shape_infer_temp.onnx + external data) before raising: keep any such
        # file in a temp dir.
        with tempfile.TemporaryDirectory(prefix="compressor-shapes-") as scratch, \
                contextlib.chdir(scratch):
            return _symbolic(model)
    except Exception:   # noqa: BLE001 - any op it cannot follow: onnx's own inference below
        pass
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError:
        return model   # the shapes the model declares; values with unknown shape count 0 bytes


def _symbolic(model):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inference = _contrib_class(SymbolicShapeInference)(2**31 - 1, True, False, 0)
    except Exception:   # noqa: BLE001 - an onnxruntime whose class no longer fits: the stock one
        return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    complete = False
    inference._preprocess(model)
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise ValueError("incomplete symbolic shape inference")
    return inference.out_mp_


def _contrib_class(base):
    """SymbolicShapeInference with rules for onnxruntime's fused matmul / conv ops (built on
    first use: onnxruntime is imported only when an ONNX file is inspected)."""
    from onnx import TensorProto, helper
    from onnxruntime.tools.symbolic_shape_infer import get_attribute, get_shape_from_sympy_shape

    class _ContribShapes(base):
        def __init__(self, *args):
            super().__init__(*args)
            self.dispatcher_.update({
                "MatMulIntegerToFloat": lambda node: self._matmul(node, 0, 1, self._type(node, 2)),
                "DynamicQuantizeMatMul": lambda node: self._matmul(node, 0, 1, TensorProto.FLOAT),
                "FusedMatMul": lambda node: self._matmul(node, 0, 1, self._type(node, 0)),
                "FusedGemm": lambda node: self._matmul(node, 0, 1, self._type(node, 0)),
                "QGemm": lambda node: self._matmul(node, 0, 3, self._type(node, 0) if len(
                    node.input) > 8 and node.input[8] else TensorProto.FLOAT),
                "FusedConv": self._fused_conv, "QAttention": self._qattention,
                "QEmbedLayerNormalization": self._qembed})

        def _type(self, node, index):
            return self.known_vi_[node.input[index]].type.tensor_type.elem_type

        def _set(self, node, elem_type, shape):
            self.known_vi_[node.output[0]].CopyFrom(
                helper.make_tensor_value_info(node.output[0], elem_type, shape))

        def _matmul(self, node, a_index, b_index, elem_type):
            """A x B with the transA / transB of Gemm and FusedMatMul (transBatch* unsupported)."""
            a, b = self._get_shape(node, a_index), self._get_shape(node, b_index)
            if get_attribute(node, "transBatchA", 0) or get_attribute(node, "transBatchB", 0):
                raise ValueError(f"{node.op_type} with transBatch: no shape rule")
            if len(a) < 2 or len(b) < 2:   # a vector operand (Gemm's are 2-D): MatMul's rule
                if (a_index, b_index) != (0, 1):
                    raise ValueError(f"{node.op_type} of a vector: no shape rule")
                self._compute_matmul_shape(node, elem_type)
                return
            if get_attribute(node, "transA", 0):
                a = [*a[:-2], a[-1], a[-2]]
            if get_attribute(node, "transB", 0):
                b = [*b[:-2], b[-1], b[-2]]
            self._set(node, elem_type, [*self._broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1]])

        def _fused_conv(self, node):
            shape = self._compute_conv_pool_shape(node)
            self._update_computed_dims(shape)
            self._set(node, self._type(node, 0), get_shape_from_sympy_shape(shape))

        def _qembed(self, node):
            """EmbedLayerNormalization's shapes; float outputs from the int8 tables."""
            self._infer_EmbedLayerNormalization(node)
            for index in (0, 2):
                if index < len(node.output) and node.output[index]:
                    self.known_vi_[node.output[index]].type.tensor_type.elem_type = TensorProto.FLOAT

        def _qattention(self, node):
            """[batch, sequence, hidden]: the input's shape with the bias's third as its width."""
            shape, bias = self._get_shape(node, 0), self._get_shape(node, 2)
            if len(node.output) > 1 and node.output[1]:
                raise ValueError("QAttention with a past state: no shape rule")
            self._set(node, TensorProto.FLOAT, [*shape[:-1], bias[0] // 3])

    return _ContribShapes
