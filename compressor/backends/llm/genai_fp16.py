"""The float16 ONNX route: float16 weights in the file, float32 compute.

onnxruntime-genai's builder targets -p fp16 at CUDA / DML: its CPU float16 graph (attention as
MultiHeadAttention with a repeated KV) runs one forward pass but fails on the second in
onnxruntime-genai 0.18 ("Shape mismatch attempting to re-use buffer" in an inserted Cast), so
a CPU artifact cannot generate. We build -p fp32 (GroupQueryAttention, the shared KV buffer)
and store each weight matrix / table as float16 behind a Cast to float: the file is half the
size; onnxruntime folds the Casts when it loads the model, so it computes in float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MATRIX_ELEMENTS = 1024   # smaller tensors (norms, biases) stay float32
HALVED_READERS = {"MatMul": 1, "Gather": 0, "Transpose": 0}   # op -> the weight input it reads


def halve_float_weights(model_path: Path) -> int:
    """Store the float32 weights MatMul / Gather / Transpose read as float16 + Cast, one tensor
    at a time; returns how many tensors were halved."""
    import onnx
    from onnx import numpy_helper

    from compressor.backends.llm.genai_graph import stream_rewrite

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    targets = {node.input[i] for node in graph.node
               for op, i in HALVED_READERS.items() if node.op_type == op and len(node.input) > i}
    halved = {t.name for t in graph.initializer if t.name in targets
              and t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) >= MATRIX_ELEMENTS}

    def halve(tensor) -> None:
        if tensor.name in halved:
            tensor.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(tensor).astype(np.float16), f"{tensor.name}.fp16"))

    casts = [onnx.helper.make_node("Cast", [f"{name}.fp16"], [name], to=onnx.TensorProto.FLOAT,
                                   name=f"/fp16_weights/{name}/Cast") for name in sorted(halved)]
    nodes = casts + list(graph.node)   # the weights exist before anything reads them
    del graph.node[:]
    graph.node.extend(nodes)
    stream_rewrite(model, model_path, halve)
    return len(halved)
