"""Two boards, one model: a model-onnx folder cut into K stages (compress split), run as one
process per stage over torch.distributed (gloo) on this machine, against the unsplit model:
identical greedy tokens (also onnxruntime-genai's), teacher-forced logits within 1e-4, stage
files that add up to the whole, stage memory within the plan's stage figure, no process left
behind, and a stage that dies or cannot start ending the run with one `error:` line, exit 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from support.genai_builds import genai_build

pytest.importorskip("onnxruntime_genai")
CONTEXT = 256


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory, lm_tokenizer):
    """A random-init 4-layer Llama as model-onnx at int8 (mechanics: 3 stages need 3+ layers)."""
    from support import tiny_lm

    model = tiny_lm.random_lm(lm_tokenizer, "llama", num_hidden_layers=4)
    folder = tiny_lm.save_hf_folder(model, lm_tokenizer,
                                    tmp_path_factory.mktemp("split-llama4") / "tiny-llama4")
    return folder, genai_build(tmp_path_factory, folder, "int8", context=CONTEXT).folder


def _split(source, out, devices, ranges=None):
    from compressor.tasks.lm.split import split_and_check

    return split_and_check(source, devices, out, ranges, check=False)


def _windows(count=4, length=24, seed=0):
    return np.random.default_rng(seed).integers(4, 512, (count, length))


def _stage_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "compressor.runtimes.split_stages" in " ".join(p.cmdline())]


def test_three_stages_give_the_unsplit_model_s_outputs(four_layers, tmp_path):
    from compressor.runtimes.split_check import check_split

    _, source = four_layers
    report = _split(source, tmp_path / "split", 3)
    assert len(report["stages"]) == 3 and report["stages"][-1]["layers"][1] == 3
    windows = _windows()
    check = check_split(source, tmp_path / "split", windows, [list(windows[0, :8])], 12, threads=1)
    assert check["max_abs_logit_diff"] <= 1e-4
    assert check["top1_agreement"] == 1.0
    assert check["perplexity"] == pytest.approx(check["perplexity_unsplit"], rel=1e-6)
    assert check["greedy_identical"] and check["genai_greedy_identical"]
    assert _stage_children() == []


def test_stage_files_hold_only_their_tensors_and_add_up_to_the_whole(four_layers, tmp_path):
    import onnx

    _, source = four_layers
    report = _split(source, tmp_path / "split", 2, [(0, 1), (2, 3)])
    split = json.loads((tmp_path / "split" / "split.json").read_text())
    # the tied embedding / lm_head table and the rotary caches are on more than one stage
    assert report["stage_bytes_total"] - report["shared_bytes"] == pytest.approx(
        report["source_bytes"], rel=0.03)
    names = [{t.name for t in onnx.load(str(tmp_path / "split" / s["file"]),
                                        load_external_data=False).graph.initializer}
             for s in split["stages"]]
    assert not any("layers.2." in n or "layers.3." in n for n in names[0])
    assert not any("layers.0." in n or "layers.1." in n for n in names[1])
    crossing = split["links"][0]["tensors"]
    assert all(t["dtype"] == "float32" and t["shape"][-1] == 64 for t in crossing)
    assert report["link_bytes_per_token"] == [len(crossing) * 64 * 4]


def test_a_stage_killed_mid_run_ends_it_naming_the_stage(four_layers, tmp_path):
    from compressor.runtimes.split_launch import StageError
    from compressor.runtimes.split_lm import SplitLm

    _, source = four_layers
    _split(source, tmp_path / "split", 3)
    runtime = SplitLm(tmp_path / "split", threads=1)
    pids = runtime.pids()
    assert len(runtime.generate([1, 5, 6], 3)) == 3
    os.kill(pids[1], signal.SIGKILL)   # stage 2
    start = time.monotonic()
    with pytest.raises(StageError, match="stage 2 died"):
        runtime.generate([1, 5, 6], 50)
    assert time.monotonic() - start < 30
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)
    assert _stage_children() == []


def test_a_stage_that_cannot_start_is_one_error_line_exit_2(four_layers, tmp_path, cli):
    _, source = four_layers
    _split(source, tmp_path / "split", 2)
    (tmp_path / "split" / "stage1.onnx").write_bytes(b"not a model")
    start = time.monotonic()
    done = cli("generate", str(tmp_path / "split"), "--prompt", "Once upon a time")
    assert time.monotonic() - start < 30
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "stage 1 cannot start" in errors[0], done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["int4", "int8"])
def test_the_trained_model_split_in_two_matches_and_fits_its_plan(recipe, trained_lm_dir,
                                                                   tmp_path_factory, tmp_path):
    """compress split on the trained LM: checked end to end (its report), and each stage's
    memory beyond what importing torch + onnxruntime costs within the plan's stage figure."""
    from compressor.tasks.lm.split import split_and_check
    from compressor.plan import plan

    source = genai_build(tmp_path_factory, trained_lm_dir, recipe, context=CONTEXT).folder
    report = split_and_check(source, 2, tmp_path / "split", threads=2)
    check = report["validation"]
    assert check["max_abs_logit_diff"] <= 1e-4 and check["top1_agreement"] == 1.0
    assert check["greedy_identical"] and check["genai_greedy_identical"]
    assert len(set(check["greedy"][0])) > 1   # a trained model: not one token repeated
    planned = plan(str(trained_lm_dir), target="jetson-orin-nx-8gb", context=CONTEXT,
                   recipes=[recipe], devices=2)["split"]["stages"]
    for stage, figure in zip(report["stages"], planned):
        print(f"{recipe} stage {stage['rank']}: {stage['bytes']:,} B, peak RSS "
              f"{stage['peak_rss_bytes']:,} B ({stage['rss_imported_bytes']:,} B after imports), "
              f"planned {figure['bytes']:,} B, sends {stage['sent_bytes_per_token']} B/token")
        assert stage["peak_rss_bytes"] - stage["rss_imported_bytes"] <= figure["bytes"]
    speed = report["speed"]
    print(f"{recipe}: decode {speed['split']['decode_tokens_per_s']} tok/s split, "
          f"{speed['single']['decode_tokens_per_s']} single")
    assert _stage_children() == []


@pytest.mark.slow
def test_two_commands_one_per_board(four_layers, tmp_path, cli):
    """`compress stage --rank 1` (torchrun's env vars) beside `compress generate --master`
    give the one-machine run's text."""
    _, source = four_layers
    _split(source, tmp_path / "split", 2)
    folder = str(tmp_path / "split")
    local = cli("generate", folder, "--prompt", "Once upon a time", "--max-new-tokens", "8")
    assert local.returncode == 0, local.stderr
    port = _free_port()
    env = {**os.environ, "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    board2 = subprocess.Popen([sys.executable, "-m", "compressor.cli", "stage", folder],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        board1 = cli("generate", folder, "--prompt", "Once upon a time", "--max-new-tokens", "8",
                     "--master", f"127.0.0.1:{port}")
        assert board2.wait(60) == 0, board2.stderr.read()
    finally:
        if board2.poll() is None:
            board2.kill()
    assert board1.returncode == 0, board1.stderr
    assert board1.stdout == local.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_split_refuses_one_stage(four_layers, tmp_path, cli):
    _, source = four_layers
    done = cli("split", str(source), "--devices", "1", "--out", str(tmp_path / "s"))
    assert done.returncode == 2 and done.stderr.startswith("error:"), done.stderr


@pytest.mark.slow
def test_compress_devices_2_publishes_a_checked_split(trained_lm_dir, tmp_path, cli):
    """`compress --devices 2`: the run's model-onnx folder split beside it in --out, checked
    against it (report.json's `split` on its row), the paths in it relative to --out."""
    out = tmp_path / "dist"
    done = cli(str(trained_lm_dir), "--recipe", "int8", "--format", "onnx", "--devices", "2",
               "--no-latency", "--threads", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (out / "split").glob("stage*.onnx")) == ["stage0.onnx",
                                                                           "stage1.onnx"]
    report = json.loads((out / "report.json").read_text())
    split = report["artifacts"][0]["split"]
    assert split["passed"] and split["failure"] is None and split["devices"] == 2
    assert split["validation"]["greedy_identical"] and split["validation"]["max_abs_logit_diff"] <= 1e-4
    assert [s["layers"] for s in split["stages"]] == [[0, 0], [1, 1]]
    assert split["link_bytes_per_token"][0] > 0 and split["decode_tokens_per_s"] is None
    written = json.loads((out / "split" / "split_report.json").read_text())
    assert written["out"] == "split" and written["source"] == "model-onnx"
    assert "split into 2 stages" in (out / "report.md").read_text()
    assert _stage_children() == []


@pytest.mark.parametrize("args, words", [(("--format", "tflite", "--devices", "2"), "add onnx"),
                                         (("--format", "onnx", "--devices", "1"), "at least 2")])
def test_compress_devices_refused_before_any_work(args, words, random_lm_dir, tmp_path, cli):
    out = tmp_path / "dist"
    done = cli(str(random_lm_dir("llama")), "--recipe", "int8", *args, "--out", str(out))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and words in errors[0] and "--devices" in errors[0], done.stderr
    assert not out.exists()


def test_compress_devices_refused_for_a_model_that_is_no_language_model(tmp_path, cli):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.ones((8, 2), np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    done = cli(str(tmp_path / "m.onnx"), "--recipe", "int8", "--devices", "2",
               "--out", str(tmp_path / "dist"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --devices 2") and "not a language model" in done.stderr
    assert not (tmp_path / "dist").exists()


def test_a_split_that_differs_fails_the_gate_exit_3():
    """A row whose `split` names a failure fails the run's accuracy gate (exit 3)."""
    from types import SimpleNamespace

    from compressor.config.steps import ValidateConfig
    from compressor.core.context import ModelState
    from compressor.core.record import RunRecord
    from compressor.run.pipeline import _judge

    session = SimpleNamespace(record=RunRecord(), validation=ValidateConfig(metric="perplexity"),
                              metric_name="perplexity", target=None)
    row = {"path": "model-onnx", "metric_value": 10.0, "drop": 0.0, "est_peak_memory_bytes": 1}
    assert _judge(session, [dict(row, split={"failure": None})], ModelState(model=None))["exit_code"] == 0
    verdict = _judge(session, [dict(row, split={"failure": "model-onnx: differs"})],
                     ModelState(model=None))
    assert verdict["exit_code"] == 3 and not verdict["gate_passed"]
    assert verdict["failures"] == ["model-onnx: differs"]
