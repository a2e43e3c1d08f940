"""What converting a language model holds in memory (issue 25): integers packed as the artifacts
store them, the float weights of a model loaded here handed back to its file once quantized (a
caller's model left alone), checkpoints written one tensor at a time, and a reported peak RSS
that adds the children's memory to the parent's."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from support import tiny_lm

# wide enough that the linears span many pages: 2 layers of 256 x 256 / 256 x 512, float32
WIDE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64)


@pytest.fixture(scope="module")
def wide_lm_dir(tmp_path_factory, lm_tokenizer) -> Path:
    model = tiny_lm.random_lm(lm_tokenizer, "llama", **WIDE)
    return tiny_lm.save_hf_folder(model, lm_tokenizer, tmp_path_factory.mktemp("wide") / "lm")


def mapped_rss(path: Path) -> int:
    """This process's resident bytes of its mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:   # a mapping's first line
            inside = len(head) == 6 and head[5] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


@pytest.mark.parametrize("bits, width", [(4, 64), (8, 128)])
def test_quantized_linears_hold_packed_bytes(bits, width):
    from compressor.backends.llm.grid import gptq, rtn
    from compressor.backends.llm.model import QuantizedLinear

    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    for grid in (rtn(weight, bits, 32), gptq(weight, torch.eye(128), bits, 32)):
        assert grid.packed.dtype == torch.uint8 and tuple(grid.packed.shape) == (64, width)
        assert grid.shape == (64, 128) and grid.q.shape == (64, 128)
        assert int(grid.q.max()) <= 2 ** bits - 1
        again = QuantizedLinear(grid.q, grid.scales, grid.zeros, bits, 32)
        assert torch.equal(again.packed, grid.packed)
    low, high = grid.q[:, 0::2], grid.q[:, 1::2]
    if bits == 4:   # input 2i in the low nibble: MatMulNBits' byte layout
        assert torch.equal(grid.packed, low | (high << 4))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("algorithm", ["rtn", pytest.param("gptq", marks=pytest.mark.slow)])
def test_a_model_loaded_here_no_longer_holds_its_quantized_float_weights(wide_lm_dir, algorithm):
    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm

    loaded = load_lm(wide_lm_dir)
    assert loaded.owned
    params = dict(loaded.model.named_parameters(remove_duplicate=False))
    values = {name: p.detach().clone() for name, p in params.items()}   # touches every page
    checkpoint = wide_lm_dir / "model.safetensors"
    before = mapped_rss(checkpoint)
    calibration = np.random.default_rng(0).integers(0, 500, (4, 32))
    quantized = quantize_lm(loaded, WeightOnlyPlan(4, 32, algorithm), calibration)
    released = sum(params[name].numel() * 4 for name in quantized)
    assert before - mapped_rss(checkpoint) > 0.9 * released
    for name, param in params.items():   # the same values, read from the file again
        assert torch.equal(param, values[name]), name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_callers_model_keeps_its_weights_resident(wide_lm_dir):
    from transformers import AutoModelForCausalLM

    from compressor.backends.llm.load import load_lm
    from compressor.backends.llm.quantize import WeightOnlyPlan, quantize_lm

    gc.collect()   # models of other tests map the same file
    model = AutoModelForCausalLM.from_pretrained(wide_lm_dir)
    loaded = load_lm(model)
    assert not loaded.owned
    sum(float(p.detach().sum()) for p in model.parameters())   # every page resident
    checkpoint = wide_lm_dir / "model.safetensors"
    before = mapped_rss(checkpoint)
    assert before > 0
    quantize_lm(loaded, WeightOnlyPlan(4, 32, "rtn"), None)
    assert mapped_rss(checkpoint) >= before


def test_streamed_safetensors_load_as_written(tmp_path):
    from safetensors.torch import load_file

    from compressor.backends.llm.streamed_safetensors import Lazy, lazy, save_streamed

    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int32),
               "c": torch.randn(2, 2, 2), "d": torch.tensor(True)}
    items = [lazy("a", tensors["a"]), Lazy("b", torch.int32, (7,), lambda: tensors["b"]),
             lazy("c", tensors["c"].numpy()), lazy("d", tensors["d"])]
    save_streamed(items, tmp_path / "x.safetensors", metadata={"format": "pt"})
    loaded = load_file(str(tmp_path / "x.safetensors"))
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[name], value) for name, value in tensors.items())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="samples /proc")
def test_the_peak_adds_a_child_to_the_parent():
    """A 300 MB child beside this process: the tree's peak is their sum, which neither
    getrusage peak (this process's, its largest child's) shows."""
    from compressor.core import memory

    memory.start_sampling()
    parent = memory.rss_of(os.getpid())
    child = "import time; block = b'x' * (300 << 20); time.sleep(2)"
    subprocess.run([sys.executable, "-c", child], check=True)
    try:
        assert memory.peak_rss_bytes() >= parent + 280 * 2 ** 20
    finally:
        memory.stop_sampling()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="samples /proc")
def test_each_run_samples_anew_right_after_the_last_one_stopped():
    from compressor.core import memory

    memory.start_sampling()
    memory.stop_sampling()
    memory.start_sampling()   # at once: the stopped thread may not have ended yet
    try:
        assert not memory._SAMPLER.stopped
    finally:
        memory.stop_sampling()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallinfo2")
def test_the_training_meter_counts_the_heap_a_loop_held_at_its_peak():
    """80 MB allocated and freed three times inside: the heap's peak increase is that block
    (not the three, not the RSS malloc may keep after the frees), and back to ~0 after. The
    RSS increase is not asserted: in a long process the block can land on pages malloc kept
    resident from earlier frees (the full suite read 13 MB for it)."""
    import time

    from compressor.core import memory

    with memory.TrainingMeter(0.005) as meter:
        for _ in range(3):
            block = np.ones(80 * 2**20, dtype=np.uint8)
            time.sleep(0.05)
            del block
    facts = meter.facts()
    assert 78 * 2**20 <= facts["peak_heap_increase_bytes"] <= 90 * 2**20, facts
    assert facts["peak_rss_bytes"] >= meter.before, facts
    assert memory.heap_in_use() - meter.heap_before < 8 * 2**20
