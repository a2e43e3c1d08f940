"""The modules tests/unit covers load no ML framework: the unit suite stays a few seconds."""
from __future__ import annotations

import subprocess
import sys

MODULES = ("compressor.backends.channel_plan", "compressor.backends.fine_tuning",
           "compressor.core.tensors", "compressor.report", "compressor.config.recipe")
FRAMEWORKS = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "torch", "torchao",
              "onnx", "onnxruntime", "ai_edge_litert", "tf2onnx", "keras")


def test_the_unit_tested_modules_import_no_framework():
    probe = (f"import importlib, sys\nfor name in {MODULES!r}:\n    importlib.import_module(name)\n"
             f"print(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
