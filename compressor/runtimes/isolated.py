"""Run an artifact in a child process: session creation, the predictions on every val input and
the batch-1 latency, in one fresh Python that imports only the runtime.

A native crash in the runtime (onnxruntime SIGSEGVs creating the session of some float16 ViT
graphs at ORT_ENABLE_ALL) then kills the child, not the run. An ONNX file that crashes is
retried at the next lower graph optimization level; one that no level runs (or a TFLite file
that crashes LiteRT) is a RuntimeCrashError naming the artifact and the runtime.

    python -m compressor.runtimes.isolated ARTIFACT INPUTS.npz OUTPUTS.npz THREADS LATENCY LEVEL
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import compressor.errors as errors
from compressor.errors import BackendUnavailableError, CompressorError
from compressor.formats import format_named, format_of
from compressor.runtimes.common import default_threads
from compressor.runtimes.onnx import ORT_LEVELS

FRAMEWORKS = ("torch", "tensorflow", "tf_keras", "jax")   # must not be loaded in the child
TIMEOUT_S = 3600
SESSION_READY = "session ready"     # the child's first stdout line once the runtime opened the file
ERROR_EXIT = 3                      # the child raised a CompressorError (one JSON line on stdout)
# Test hook: "model.onnx" (every level) or "model.onnx@ORT_ENABLE_ALL,..." makes the child die of
# SIGSEGV where the runtime would open that file, as onnxruntime does on the graphs above.
CRASH_HOOK = "COMPRESSOR_TEST_CRASH_AT"


class RuntimeCrashError(BackendUnavailableError):
    """The runtime died (a signal, or no answer in TIMEOUT_S) running an artifact."""


class RuntimeRunError(BackendUnavailableError):
    """The runtime opened the artifact but raised running it on the given inputs."""


@dataclass(frozen=True)
class IsolatedRun:
    """What the child measured: outputs (one array, or a dict name -> array in the artifact's
    order), the runtime's name and threads, latency ({"p50", "p90", "threads", "frameworks"}) or
    None, the onnxruntime level that ran the file (None for TFLite), and the levels that crashed."""

    outputs: np.ndarray | dict[str, np.ndarray]
    runtime: str
    threads: int
    latency: dict | None
    optimization_level: str | None = None
    crashed: tuple[str, ...] = field(default=())


def run_isolated(path: Path, x, workdir: Path, threads: int | None = None,
                 latency: bool = False) -> IsolatedRun:
    """Predict `x` (an array, or a dict name -> array) with `path` in a child process, passing
    arrays through .npz files in `workdir`; timing batch-1 latency there too when `latency`."""
    path, threads = Path(path), default_threads(threads)
    inputs, outputs = Path(workdir) / "isolated-inputs.npz", Path(workdir) / f"isolated-{path.name}.npz"
    _save(inputs, x)
    levels = ORT_LEVELS if "optimization" in format_named(format_of(path)).options else ("",)
    crashed: list[tuple[str, str]] = []   # (level, "SIGSEGV while creating its session")
    try:
        for level in levels:
            command = [sys.executable, "-m", "compressor.runtimes.isolated", str(path),
                       str(inputs), str(outputs), str(threads), str(int(latency)), level]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=_child_env(),
                                      check=False, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise RuntimeCrashError(f"{path.name}: {_runtime_label(path)} gave no answer "
                                        f"within {TIMEOUT_S} s; not validated") from None
            if done.returncode == 0:
                meta = json.loads(done.stdout.strip().splitlines()[-1])
                return IsolatedRun(_load(outputs), meta["runtime"], meta["threads"], meta["latency"],
                                   level or None, tuple(f"{lv}: {why}" for lv, why in crashed))
            if done.returncode > 0:
                raise _child_error(path, done)
            crashed.append((level, _crash_text(done)))
    finally:
        inputs.unlink(missing_ok=True)
        outputs.unlink(missing_ok=True)
    raise RuntimeCrashError(f"{path.name} crashed {_runtime_label(path)} {_where(crashed)}")


def _where(crashed: list[tuple[str, str]]) -> str:
    """"(SIGSEGV while creating its session) at every graph optimization level (A, B, ...)"."""
    reasons = {why for _, why in crashed}
    if len(crashed) == 1:
        return f"({crashed[0][1]})"
    if len(reasons) == 1:
        return (f"({reasons.pop()}) at every graph optimization level "
                f"({', '.join(level for level, _ in crashed)})")
    return "at every graph optimization level (" + "; ".join(
        f"{level}: {why}" for level, why in crashed) + ")"


def _save(file: Path, arrays) -> None:
    """Arrays under positional keys, their names beside them (names may hold '/' or ':')."""
    named = dict(arrays) if isinstance(arrays, Mapping) else None
    values = list(named.values()) if named is not None else [arrays]
    np.savez(file, names=np.array(list(named) if named is not None else [], dtype=str),
             **{f"a{i}": np.asarray(v) for i, v in enumerate(values)})


def _load(file: Path):
    with np.load(file, allow_pickle=False) as data:
        names = [str(n) for n in data["names"]]
        values = [data[f"a{i}"] for i in range(len(data.files) - 1)]
    return dict(zip(names, values)) if names else values[0]


def _child_env() -> dict[str, str]:
    package_root = str(Path(__file__).resolve().parents[2])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [package_root, os.environ.get("PYTHONPATH")])))


def _runtime_label(path: Path) -> str:
    """"onnxruntime 1.32.0" / "ai-edge-litert 2.3.0", read from the installed packages."""
    from importlib import metadata   # here: the child need not pay for importing it

    fmt = format_named(format_of(path))
    for package in fmt.packages:
        try:
            return f"{package} {metadata.version(package)}"
        except metadata.PackageNotFoundError:
            continue
    return fmt.packages[0] if fmt.packages else fmt.runtime


def _crash_text(done: subprocess.CompletedProcess) -> str:
    try:
        name = signal.Signals(-done.returncode).name
    except ValueError:
        name = f"signal {-done.returncode}"
    stage = "running it" if SESSION_READY in done.stdout else "creating its session"
    return f"{name} while {stage}"


def _child_error(path: Path, done: subprocess.CompletedProcess) -> Exception:
    """The child's CompressorError raised again here; any other failure is a bug in compressor
    and keeps the child's traceback."""
    if done.returncode == ERROR_EXIT:
        error = json.loads(done.stdout.strip().splitlines()[-1])
        cls = RuntimeRunError if error["error"] == RuntimeRunError.__name__ else \
            getattr(errors, error["error"], CompressorError)
        return (cls if isinstance(cls, type) and issubclass(cls, CompressorError)
                else CompressorError)(error["message"])
    return RuntimeError(f"validating {path.name} in a child process failed (exit "
                        f"{done.returncode}):\n{done.stderr[-3000:]}")


def _crash_if_asked(path: Path, level: str) -> None:
    name, _, levels = os.environ.get(CRASH_HOOK, "").partition("@")
    if name == path.name and (not levels or level in levels.split(",")):
        os.kill(os.getpid(), signal.SIGSEGV)


def main(argv: list[str]) -> int:
    from compressor.runtimes import open_runtime
    from compressor.core.tensors import take

    path, inputs, outputs = Path(argv[0]), Path(argv[1]), Path(argv[2])
    threads, latency, level = int(argv[3]), argv[4] == "1", argv[5] or None
    try:
        x = _load(inputs)
        _crash_if_asked(path, level or "")
        runtime = open_runtime(path, threads=threads, optimization=level)
        print(SESSION_READY, flush=True)
        try:
            _save(outputs, runtime.predict(x))
            timing = runtime.latency_ms(take(x, slice(0, 1))) if latency else None
        except CompressorError:
            raise
        except Exception as exc:   # onnxruntime / LiteRT raise their own classes (InvalidArgument, ...)
            raise RuntimeRunError(f"{path.name}: {runtime.name} failed running it "
                                  f"({type(exc).__name__}: {errors.first_line(exc, 200)})") from exc
    except CompressorError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return ERROR_EXIT
    if timing is not None:
        timing = {**timing, "threads": runtime.threads,
                  "frameworks": sorted(name for name in FRAMEWORKS if name in sys.modules)}
    print(json.dumps({"runtime": runtime.name, "threads": runtime.threads, "latency": timing}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
