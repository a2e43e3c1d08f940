"""`compress MODULE:FUNCTION` on a language model with a --target: the plan cannot be read
before loading (there is no path to read shapes from), so it is made from the loaded model's
config, refusing (exit 4) or recorded (report.json `plan`) as a path's plan is. The pre-run
check refused every such reference ("is not a file, a folder or a built-in model") unless
--force-plan."""
from __future__ import annotations

import shutil

import pytest

FACTORY = '''
from transformers import AutoModelForCausalLM, AutoTokenizer


def build():
    return (AutoModelForCausalLM.from_pretrained({folder!r}),
            AutoTokenizer.from_pretrained({folder!r}))
'''


@pytest.fixture
def factory(random_lm_dir, tmp_path, monkeypatch):
    """`tiny_factory:build`, returning (model, tokenizer) of the random tiny Llama."""
    (tmp_path / "tiny_factory.py").write_text(FACTORY.format(folder=str(random_lm_dir("llama"))))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tiny_factory:build"


def test_a_plan_over_the_budget_is_refused_once_loaded(factory, tmp_path, capsys):
    from compressor.cli import main

    board = tmp_path / "tiny-board.yaml"
    board.write_text("name: tiny-board\nmemory_bytes: 64KB\nmodel_share: 0.5\nllm_share: 0.5\n"
                     "arch: aarch64\nruntimes: [onnxruntime]\n")
    code = main(["--recipe", "fp16", factory, "--target", str(board), "--out",
                 str(tmp_path / "out")])
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 4, error
    assert error.startswith("error: plan: ") and "tiny-board.yaml has 0.00 GB for a language model" in error, error
    assert not (tmp_path / "out").exists()


def test_a_plan_that_fits_is_recorded_as_a_paths_is(factory, tmp_path):
    from compressor.core.memory import stop_sampling
    from compressor.run.session import open_session

    session = open_session(factory, "int4", data="text", out_dir=tmp_path / "out",
                           target="jetson-orin-nx-8gb", formats=("onnx",), latency=False)
    shutil.rmtree(session.ctx.workdir)
    stop_sampling()
    plan = session.record.notes["plan"]
    assert plan["target"] == "jetson-orin-nx-8gb" and plan["plans"][0]["fits"]
    assert plan["plans"][0]["recipe"] == "int4"
