"""Framework-neutral artifact work, shared by every backend's exporters.

- onnx.py: checked saves, float16 conversion, layer-name matching on ONNX graphs.
- onnx_mixed.py: float layers inside int8 / float16 ONNX graphs.
- tflite.py: TFLite flatbuffer edits (float16 weights) and op-level dtype reads.
- onnx_quant.py (+ onnx_prepare.py, onnx_weight_only.py): int8 ONNX from a float32 ONNX
  with onnxruntime's quantization tools: static QDQ (calibrated), dynamic, weight-only.
- int8.py: the read-back check that an "int8" artifact computes its kernels in int8.

The framework-specific routes (TFLiteConverter, tf2onnx, torch.onnx, litert-torch) live in
backends/keras and backends/torch. Nothing here imports a backend.
"""
from __future__ import annotations

from compressor.formats import FORMAT_NAMES

# The registered format names (compressor/formats), read at each use.
FORMATS = FORMAT_NAMES
