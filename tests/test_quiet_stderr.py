"""A `compress` run's stderr holds only compressor's own lines: library start-up noise
(torchao, torch's pytree deprecation, TensorFlow's absl / CUDA-probe banners, converter
warnings) stays off the terminal unless --debug.

"Ours" is a whitelist of the shapes compressor's Progress and error paths write, not a list
of known noise: any line a library adds fails the test.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_cli

TORCH_BUILDER = "compressor.backends.examples:torch_digits_cnn"   # untrained: noise only
OUR_LINES = [re.compile(pattern) for pattern in (
    r"warning: \S.*",                                     # ours (sanity, pipeline)
    r"error: \S.*",                                       # cli_guard
    r"\[\d+/\d+\] [a-z_0-9]+",                            # pipeline: one per recipe step
    r"export (tflite|onnx)(: .+)?",                       # pipeline / backend notes
    r"validate \S+ in its runtime",                       # pipeline
    r"(int8 fallback|reference|quantize|data-parallel fine-tuning)\b.+",   # Progress.info
    # Progress.task: description, rich's bar, done/total, elapsed, remaining
    r"[a-z][\w .-]* [━╸╺ ]+ \d+/\d+ \d+:\d\d:\d\d( \d+:\d\d:\d\d| -:--:--)?",
)]


def foreign_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.strip() and not any(p.fullmatch(line.rstrip()) for p in OUR_LINES)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, untrained_keras_file):
    """One PyTorch and one Keras int8 compress to tflite + onnx, side by side (~30 s)."""
    folder = tmp_path_factory.mktemp("quiet")
    commands = {
        "torch": (TORCH_BUILDER, "--recipe", "int8", "--format", "tflite,onnx",
                  "--out", str(folder / "torch"), "--no-latency"),
        "keras": (str(untrained_keras_file), "--recipe", "int8", "--format", "tflite,onnx",
                  "--out", str(folder / "keras"), "--no-latency"),
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = {name: pool.submit(run_cli, *args, cwd=folder) for name, args in commands.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "keras"])
def test_every_stderr_line_is_ours(runs, backend):
    result = runs[backend]
    assert result.returncode == 0, result.stderr[-2000:]
    assert foreign_lines(result.stderr) == []
    lines = result.stderr.splitlines()
    # what the run must still say: each step, export and validation, the calibration bar
    for expected in ("[1/1] quantize", "export tflite", "export onnx",
                     "validate model.tflite in its runtime", "validate model.onnx in its runtime"):
        assert expected in lines
    assert any(line.startswith("calibrating int8 ") for line in lines)
    # the warning about the user's model (an untrained net scores at chance) is kept
    assert any(line.startswith("warning: the original model scores ") for line in lines)
    assert "PASSED" in result.stdout


def test_the_whitelist_rejects_library_lines():
    noise = """\
Skipping import of cpp extensions due to TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
W1201 20:46:32.885000 21583 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796157917.885728   20754 cudart_stub.cc:31] Could not find cuda drivers
WARNING:root:Axis 1 is out-of-range for weight 'w' with rank 1
Generating Quantization Parameters:: 100%|██████████| 120/120 [00:01<00:00, 99.0it/s]
Your model is converted in training mode. Please set the module in evaluation mode
"""
    ours = """\
warning: the original model scores 0.1000, about chance (0.1000)
[1/2] prune
calibrating int8 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 256/256 0:00:01 0:00:00
export tflite
validate model.onnx in its runtime
"""
    assert foreign_lines(noise) == noise.splitlines()
    assert foreign_lines(ours) == []
