"""`import compressor` and `compress --help` load no ML framework (they cost seconds each)."""
from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("tensorflow", "tf_keras", "tensorflow_model_optimization", "torch", "torchao",
              "onnx", "onnxruntime", "ai_edge_litert", "tf2onnx", "keras")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_import_compressor_loads_no_framework():
    assert _loaded_after("import compressor as cz; cz.compress; cz.Data; cz.load_recipe") == []


def test_help_loads_no_framework():
    code = ("import contextlib, io\nfrom compressor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass")
    assert _loaded_after(code) == []


def test_recipes_list_loads_no_framework():
    code = ("import contextlib, io\nfrom compressor.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['recipes', 'list'])")
    assert _loaded_after(code) == []


def test_public_functions_stay_functions_after_their_module_is_imported():
    # `from compressor.run.sweep import sweep` (as cli_commands does) used to turn cz.sweep
    # into the module, and `cz.sweep(...)` failed with "'module' object is not callable".
    code = ("from compressor.run.sweep import sweep\nimport compressor.run.sweep\nimport compressor as cz\n"
            "print(type(cz.sweep).__name__, type(cz.plot_pareto).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["function", "function"]
