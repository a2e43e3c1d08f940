"""The ops that hold a model's weights, per artifact format: one table each, shared by the
exporters (int8 checks, float16 edits) and the runtimes (inspection, memory estimates).

op type -> the input indices that can hold its weights. A weight may reach its op through
dequantize / cast / layout ops (fp16 TFLite, QDQ ONNX); PASSTHROUGH maps those op types to
the input to follow back.
"""
from __future__ import annotations

# TRANSPOSE_CONV's inputs are (output_shape, weights, input).
TFLITE_KERNEL_INPUTS = {"CONV_2D": (1,), "DEPTHWISE_CONV_2D": (1,), "FULLY_CONNECTED": (1,),
                        "TRANSPOSE_CONV": (1,), "CONV_3D": (1,), "CONV_3D_TRANSPOSE": (1,),
                        "BATCH_MATMUL": (0, 1)}
TFLITE_PASSTHROUGH = {"DEQUANTIZE": 0, "DENSIFY": 0, "TRANSPOSE": 0, "RESHAPE": 0}

ONNX_KERNEL_INPUTS = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (0, 1), "MatMul": (0, 1),
                      "ConvInteger": (1,), "MatMulInteger": (0, 1), "QLinearConv": (3,),
                      "QLinearMatMul": (0, 3), "MatMulNBits": (1,)}
ONNX_PASSTHROUGH = {"DequantizeLinear": 0, "Cast": 0, "Identity": 0, "Transpose": 0, "Reshape": 0}
