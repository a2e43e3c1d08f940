"""Every bad input, hostile file and broken environment ends the same way: exactly one
`error:` line of at most 500 characters, the documented exit code, no traceback, and no
folders left in the temp dir or beside --out. The cases run `compressor.cli.main` in this
process (TensorFlow is imported once); test_cli.py covers the same path in subprocesses."""
from __future__ import annotations

import numpy as np
import pytest

from compressor.cli import main

SUBCLASSES_OF_WORK = ("compressor-", ".out.")


@pytest.fixture(scope="module")
def nan_weights_file(tmp_path_factory):
    from compressor.backends.examples import keras_digits_cnn

    model = keras_digits_cnn()
    model.set_weights([np.full_like(w, np.nan) for w in model.get_weights()])
    path = tmp_path_factory.mktemp("nan") / "nan.keras"
    model.save(path)
    return path


def _digits(**changes):
    from compressor.tasks.array.data import digits

    data = digits()
    arrays = {"x_train": data.train[0][:64], "y_train": data.train[1][:64],
              "x_val": data.val[0][:32], "y_val": data.val[1][:32]}
    for key, change in changes.items():
        arrays[key] = change(arrays[key].copy())
    return {k: v for k, v in arrays.items() if v is not None}


def _poke(index, value):
    def change(array):
        array.flat[index] = value
        return array
    return change


def _alias_bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\nname: *a8\n"


def _extends_chain(folder, depth=20):
    for i in range(depth):
        parent = f"extends: {folder / f'r{i + 1}.yaml'}\n" if i + 1 < depth else ""
        (folder / f"r{i}.yaml").write_text(f"{parent}name: r{i}\nsteps: []\n")
    return str(folder / "r0.yaml")


def _onnx_with_external(folder, location):
    from onnx import TensorProto

    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[64, 10])
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    weight.external_data.add(key="length", value=str(64 * 10 * 4))
    return _onnx_matmul(folder / "model.onnx", weight)


def _tiny_onnx(folder):
    from onnx import numpy_helper

    return _onnx_matmul(folder / "tiny.onnx", numpy_helper.from_array(np.ones((64, 10), np.float32), "w"))


def _onnx_matmul(path, weight):
    """x (N, 8, 8, 1) -> Flatten -> MatMul with `weight` -> (N, 10), saved at `path`."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _write(folder, name, text):
    (folder / name).write_text(text)
    return str(folder / name)


def _module(folder, name, text):
    """A module importable from the current directory (the test's tmp_path): `name:load`."""
    (folder.parent / f"{name}.py").write_text(text)
    return f"{name}:load"


def _npz(folder, name, arrays):
    np.savez(folder / name, **arrays)
    return str(folder / name)


# id -> (argv builder(tmp, model, nan_model) -> argv, fragment expected in the error line)
CASES = {
    "alias bomb": (lambda t, m, n: ["--recipe", _write(t, "bomb.yaml", _alias_bomb()), m],
                   "aliases counted expanded"),
    "recursive alias": (lambda t, m, n: ["--recipe", _write(t, "loop.yaml", "a: &a [*a]\nname: x\n"), m],
                        "nested more than"),
    "many unknown keys": (lambda t, m, n: ["--recipe", _write(
        t, "keys.yaml", "name: k\n" + "".join(f"key{i}: {i}\n" for i in range(2000))), m],
        "and 1995 more errors"),
    "huge recipe": (lambda t, m, n: ["--recipe", _write(t, "big.yaml", "name: b\n#" + "x" * 70000), m],
                    "a recipe is at most"),
    "extends chain": (lambda t, m, n: ["--recipe", _extends_chain(t), m], "`extends` chain deeper"),
    "many steps": (lambda t, m, n: ["--recipe", _write(
        t, "steps.yaml", "name: s\nsteps:\n" + "  - {pass: prune, sparsity: 0.1}\n" * 200), m],
        "at most 64"),
    "prune undone by a lower prune": (lambda t, m, n: ["--recipe", _write(
        t, "undo.yaml", "name: u\nsteps:\n  - {pass: prune, sparsity: 0.5}\n"
        "  - {pass: prune, sparsity: 0.2}\n"), m], "would undo the earlier one"),
    "long recipe name": (lambda t, m, n: ["--recipe", "r" * 300, m], "not a recipe name"),
    "long model path": (lambda t, m, n: ["--recipe", "fp16", "m" * 300 + ".keras"], "name too long"),
    "unknown option": (lambda t, m, n: ["--recipe", "fp16", m, "--bogus"], "unrecognized arguments"),
    "NaN in x_train": (lambda t, m, n: ["--recipe", "int8", m, "--data", _npz(
        t, "d.npz", _digits(x_train=_poke(5, np.nan)))], "x_train has 1 NaN or Inf"),
    "Inf in x_val": (lambda t, m, n: ["--recipe", "fp16", m, "--data", _npz(
        t, "d.npz", _digits(x_val=_poke(0, np.inf)))], "x_val has 1 NaN or Inf"),
    "label out of range": (lambda t, m, n: ["--recipe", "fp16", m, "--data", _npz(
        t, "d.npz", _digits(y_val=_poke(3, 99)))], "labels from 0 to 99"),
    "no val samples": (lambda t, m, n: ["--recipe", "fp16", m, "--data", _npz(
        t, "d.npz", _digits(x_val=lambda a: a[:0], y_val=lambda a: a[:0]))], "x_val has no samples"),
    "NaN weights": (lambda t, m, n: ["--recipe", "fp16", n], "NaN or Inf outputs"),
    "data module raises at import": (lambda t, m, n: [
        "--recipe", "fp16", m, "--data", _module(t, "bad_data_a", "1 / 0\n")], "ZeroDivisionError"),
    "data function raises": (lambda t, m, n: [
        "--recipe", "fp16", m, "--data", _module(t, "bad_data_b", "def load():\n    raise KeyError(1)\n")],
        "raised KeyError"),
    "model module raises at import": (lambda t, m, n: [
        "--recipe", "fp16", _write(t, "bad_model.py", "raise RuntimeError('boom')\n") + ":build"],
        "RuntimeError: boom"),
    "out is a file": (lambda t, m, n: ["--recipe", "fp16", m, "--out", _write(t, "out", "x")],
                      "is a file"),
    "out under a file": (lambda t, m, n: ["--recipe", "fp16", m, "--out", _write(t, "f", "x") + "/out"],
                         "which is a file"),
    "out under /proc": (lambda t, m, n: ["--recipe", "fp16", m, "--out", "/proc/self/out"],
                        "pseudo file system"),
    "force over foreign files": (lambda t, m, n: ["--recipe", "fp16", m, "--force", "--out",
                                                  _write(t, "keep.txt", "x").rsplit("/", 1)[0]],
                                 "did not write (keep.txt"),
    "eval external data outside": (lambda t, m, n: [
        "eval", _onnx_with_external(t, "../../../../etc/hostname"), "--data", "digits"],
        "outside the model's folder"),
    "eval wrong shape": (lambda t, m, n: ["eval", _tiny_onnx(t), "--data", _npz(
        t, "d.npz", {"x_val": np.zeros((4, 3), np.float32), "y_val": np.zeros(4, np.int64)})],
        "takes"),
    "inspect not onnx": (lambda t, m, n: ["inspect", _write(t, "x.onnx", "not onnx")],
                         "not a readable ONNX file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_error_line(case, tmp_path, untrained_keras_file, nan_weights_file, capsys):
    build, fragment = CASES[case]
    inputs = tmp_path / "in"
    inputs.mkdir()
    argv = build(inputs, str(untrained_keras_file), str(nan_weights_file))
    if "--out" not in argv and argv[0] not in ("eval", "inspect"):
        argv += ["--out", str(tmp_path / "out")]
    before = set(inputs.iterdir())
    code = main([*argv, "--no-latency"] if argv[0] not in ("eval", "inspect") else argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(errors) == 1 and len(errors[0]) <= 500, err
    assert fragment in errors[0], err
    assert "Traceback" not in err
    left = [p.name for p in (*tmp_path.iterdir(), *(tmp_path / "tmp").iterdir())
            if p.name.startswith(SUBCLASSES_OF_WORK) or ".partial-" in p.name or p.name == "out"]
    assert not left, left
    assert set(inputs.iterdir()) == before or case.startswith(("out ", "force"))
