"""Runs artifacts in their runtimes, in a child process of the harness (a crash stays there).

    python -m bench.probe evaluate --data digits|FILE.npz ARTIFACT...
    python -m bench.probe latency --threads N --rounds R --runs K [--inputs FILE.npz] ARTIFACT...
    python -m bench.probe fidelity --data FILE.npz ARTIFACT...

Both sides' artifacts (toolkit and baseline) go through this same code, which uses
compressor.runtimes (LiteRT / onnxruntime), so differences come from the artifacts.
`latency` opens every artifact once, warms each up, then times them round-robin
(A B A B ...) and reports the median of the per-round batch-1 p50s: on random float inputs,
or on the first row of the named inputs `x.NAME` in --inputs (token ids, several inputs).
`fidelity` compares each artifact's outputs on the inputs `x.NAME` with the reference
outputs `ref.NAME` (the float model's): mean and lowest per-row cosine per output, and the
lowest of the means.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from bench.measure import artifact_sizes


def input_shape(path: Path) -> tuple[int, ...]:
    """The artifact's first input shape with the batch (and any symbolic dim) set to 1."""
    from compressor.runtimes import inspect_artifact

    shape = inspect_artifact(path).inputs[0]["shape"]
    return tuple(d if isinstance(d, (int, np.integer)) and d > 0 else 1 for d in shape)


def digits_for(shape: tuple[int, ...]):
    from compressor.tasks.array.data import digits

    return digits("NCHW" if shape[1] == 1 else "NHWC").val


def evaluate(paths: list[str], data: str) -> list[dict]:
    from compressor.runtimes import inspect_artifact, open_runtime

    rows = []
    for path in map(Path, paths):
        row = {"path": str(path)}
        try:
            info = inspect_artifact(path)
            weight_bytes = sum(w.size * np.dtype(w.dtype).itemsize for w in info.weights)
            row.update(artifact_sizes(path), weight_bytes=int(weight_bytes),
                       weight_dtypes=info.weight_dtypes,
                       sparsity=round(info.sparsity, 4), params=info.params,
                       input_shape=[d if isinstance(d, int) else None for d in info.inputs[0]["shape"]])
            if data == "digits":
                x, y = digits_for(input_shape(path))
            else:
                with np.load(data) as npz:
                    x, y = npz["x_val"], npz["y_val"]
            logits = open_runtime(path, threads=None).predict(x)
            row["accuracy"] = float(np.mean(np.argmax(logits.reshape(len(x), -1), 1) == y))
        except Exception as exc:  # noqa: BLE001  recorded for this artifact; the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rows.append(row)
    return rows


def named(npz_path: str, prefix: str) -> dict[str, np.ndarray]:
    """The arrays `PREFIX.NAME` of an .npz, keyed by NAME."""
    with np.load(npz_path) as npz:
        return {k[len(prefix) + 1:]: npz[k] for k in npz.files if k.startswith(prefix + ".")}


def fidelity(paths: list[str], data: str) -> list[dict]:
    from compressor.runtimes import open_runtime
    from compressor.tasks.array.metrics import mean_cosine

    inputs, reference = named(data, "x"), named(data, "ref")
    rows = []
    for path in paths:
        row = {"path": path, **artifact_sizes(Path(path))}
        try:
            runtime = open_runtime(Path(path), threads=None)
            outputs = runtime.predict(inputs)
            if not isinstance(outputs, dict):      # one output: predict gives the array
                outputs = {runtime.output_names[0]: outputs}
            row["cosine"] = {name: round(mean_cosine(outputs[name], want), 6)
                             for name, want in reference.items()}
            row["cosine_min"] = {name: round(min(mean_cosine(got[None], want[None])
                                                 for got, want in zip(outputs[name], wanted)), 6)
                                 for name, wanted in reference.items()}
            row["fidelity"] = min(row["cosine"].values())
        except Exception as exc:  # noqa: BLE001  recorded for this artifact; the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rows.append(row)
    return rows


def latency(paths: list[str], threads: int, rounds: int, runs: int, warmup: int = 20,
            inputs: str | None = None) -> dict:
    from compressor.runtimes import open_runtime

    rng = np.random.default_rng(0)
    opened, result = {}, {}
    for path in paths:
        try:
            runtime = open_runtime(Path(path), threads=threads)
            x = {k: v[:1] for k, v in named(inputs, "x").items()} if inputs else \
                rng.random(input_shape(Path(path)), dtype=np.float32)
            runtime.latency_ms(x, warmup=warmup, runs=runs)   # warm-up round, not recorded
            opened[path] = (runtime, x)
            result[path] = {"p50_rounds": [], "runtime_version": runtime.name,
                            "threads": runtime.threads}
        except Exception as exc:  # noqa: BLE001  recorded; the other artifacts still run
            result[path] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    order = list(opened.items())
    for round_ in range(rounds):
        # every other round backwards: no artifact always runs right after the same other one
        for path, (runtime, x) in (order if round_ % 2 == 0 else order[::-1]):
            result[path]["p50_rounds"].append(runtime.latency_ms(x, warmup=3, runs=runs)["p50"])
    for path in opened:
        result[path]["p50_ms"] = statistics.median(result[path]["p50_rounds"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate")
    ev.add_argument("--data", default="digits")
    ev.add_argument("paths", nargs="+")
    lat = sub.add_parser("latency")
    lat.add_argument("--threads", type=int, required=True)
    lat.add_argument("--rounds", type=int, default=5)
    lat.add_argument("--runs", type=int, default=100)
    lat.add_argument("--inputs", help=".npz with the inputs as x.NAME arrays")
    lat.add_argument("paths", nargs="+")
    fid = sub.add_parser("fidelity")
    fid.add_argument("--data", required=True, help=".npz with x.NAME inputs, ref.NAME outputs")
    fid.add_argument("paths", nargs="+")
    args = parser.parse_args()
    if args.command == "evaluate":
        print(json.dumps(evaluate(args.paths, args.data)))
    elif args.command == "fidelity":
        print(json.dumps(fidelity(args.paths, args.data)))
    else:
        print(json.dumps(latency(args.paths, args.threads, args.rounds, args.runs,
                                 inputs=args.inputs)))


if __name__ == "__main__":
    main()
