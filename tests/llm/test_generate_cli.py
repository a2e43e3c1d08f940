"""`compress generate ARTIFACT --prompt TEXT`: the artifact's text streamed, then its speed;
each bad input one `error:` line and exit 2."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from compressor.cli import main
from support.genai_builds import genai_build

pytestmark = pytest.mark.slow

CONTEXT = 96
SPEED_LINE = re.compile(r"^(\d+) tokens, [\d.]+ tokens/s \(onnxruntime-genai, 1 thread; "
                        r"prompt (\d+) tokens, first token after \d+ ms\)$")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, trained_lm_dir):
    return genai_build(tmp_path_factory, trained_lm_dir, "int4", context=CONTEXT).folder


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_streams_the_artifacts_greedy_text_then_its_speed(folder, cli):
    from tokenizers import Tokenizer

    from compressor.runtimes.lm import open_lm_runtime

    done = cli("generate", str(folder), "--prompt", "The old man", "--max-new-tokens", "12",
               "--threads", "1")
    assert done.returncode == 0, done.stderr
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompt = tokenizer.encode("The old man").ids
    expected = open_lm_runtime(folder, threads=1).generate(prompt, 12, stop_ids=(2,))
    assert done.stdout == tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    assert done.stdout.strip()     # the trained model says something
    speed = SPEED_LINE.match(done.stderr.strip().splitlines()[-1])
    assert speed and int(speed[1]) == len(expected) and int(speed[2]) == len(prompt)


def test_chat_wraps_the_prompt_in_the_chat_template(folder, capsys):
    code, out, err = run(capsys, folder, "--prompt", "Tell me a story", "--chat",
                         "--max-new-tokens", "8", "--threads", "1")
    assert code == 0, err
    speed = SPEED_LINE.match(err.strip().splitlines()[-1])
    # <s><|user|>\nTell me a story</s>\n<|assistant|>\n: more tokens than the bare prompt
    assert speed and int(speed[2]) > 8


def _classifier_onnx(path):
    import onnx
    from onnx import TensorProto, helper

    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 2], np.ones(8, np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "classifier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              [weight])
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_bad_inputs_are_one_error_line_and_exit_2(folder, tmp_path, capsys):
    from support import tiny_lm

    no_tokenizer = tmp_path / "model-onnx"
    shutil.copytree(folder, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    (tmp_path / "garbage.tflite").write_bytes(b"not a flatbuffer" * 8)
    long_prompt = " ".join(tiny_lm.builtin_texts()[1].split()[:200])
    cases = [
        ((folder, "--prompt", "   "), "error: --prompt is empty"),
        ((folder, "--prompt", long_prompt), "error: the prompt is "),
        ((_classifier_onnx(tmp_path / "classifier.onnx"), "--prompt", "hi"),
         "error: " + str(tmp_path / "classifier.onnx") + ": not a language-model artifact"),
        ((tmp_path / "garbage.tflite", "--prompt", "hi"), "error: "),
        ((no_tokenizer, "--prompt", "hi"), f"error: {no_tokenizer} has no tokenizer.json"),
        ((tmp_path / "missing", "--prompt", "hi"), f"error: {tmp_path / 'missing'} does not exist"),
        ((folder, "--prompt", "hi", "--max-new-tokens", "0"), "error: --max-new-tokens 0"),
    ]
    for argv, start in cases:
        code, out, err = run(capsys, *argv)
        lines = err.strip().splitlines()
        assert (code, len(lines), out) == (2, 1, ""), (argv[0], err)
        assert lines[0].startswith(start), lines[0]
    code, _, err = run(capsys, folder, "--prompt", long_prompt)
    assert f"but model-onnx's context is {CONTEXT}" in err
