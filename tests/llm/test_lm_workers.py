"""`compress --workers 2` on a language model's training pass (backends/llm/lm_train.py under
torchrun): every rank takes half of each batch and the summed gradients make the steps one
process makes on the whole batch, so the artifact matches a single-process run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import compressor as cz  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = """name: lm_qat_short
description: int4 QAT, a few steps
steps:
  - pass: quantize
    mode: qat
    dtype: int4
    group_size: 32
    algorithm: rtn
    int8_budget: 1.0
    epochs: 3
    batch_size: {batch}
    lr: 1.0e-3
    calibration_windows: 24
export: [onnx]
validate:
  metric: perplexity
  max_increase: 0.5
"""


def _workers_run(model: Path, batch: int, out: Path, tmp_path: Path
                 ) -> tuple[subprocess.CompletedProcess, Path]:
    """`compress --workers 2` of RECIPE at `batch`: (the finished run, the recipe file)."""
    recipe = tmp_path / "qat.yaml"
    recipe.write_text(RECIPE.format(batch=batch))
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    run = subprocess.run([sys.executable, "-m", "compressor.cli", str(model), "--recipe",
                          str(recipe), "--data", "text", "--out", str(out), "--no-latency",
                          "--workers", "2"], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    return run, recipe


@pytest.mark.slow
def test_two_workers_train_an_lm_to_the_single_process_result(trained_lm_dir, tmp_path):
    run, recipe = _workers_run(trained_lm_dir, 8, tmp_path / "two", tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "data-parallel fine-tuning on 2 ranks (gloo)" in run.stdout + run.stderr
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    one = cz.compress(str(trained_lm_dir), recipe=str(recipe), data="text", latency=False,
                      out_dir=tmp_path / "one").report
    assert two["training"]["ranks"] == 2 and one["training"]["ranks"] == 1
    assert two["training"]["tokens"] == one["training"]["tokens"]
    assert two["training"]["loss_last"] != two["training"]["loss_first"]   # it trained
    assert two["training"]["loss_last"] == pytest.approx(one["training"]["loss_last"], rel=0.05)
    (a,), (b,) = two["artifacts"], one["artifacts"]
    assert a["size_bytes"] == b["size_bytes"]
    assert a["perplexity_increase"] == pytest.approx(b["perplexity_increase"], abs=1e-3)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["one", "tmp", "two"]


@pytest.mark.slow
def test_a_batch_smaller_than_the_ranks_is_refused_with_exit_2(trained_lm_dir, tmp_path):
    run, _ = _workers_run(trained_lm_dir, 1, tmp_path / "out", tmp_path)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "a batch of 1 windows cannot be shared by 2 ranks" in run.stdout + run.stderr
    assert not (tmp_path / "out").exists()
