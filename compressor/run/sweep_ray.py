"""Sweeps on Ray: one Ray task per recipe, rows gathered in recipe order.

Imported only for `executor="ray"`, so `import compressor` never loads Ray. Without an
address a private local Ray (2 CPUs, every listener on 127.0.0.1, its temp dir removed after)
is started for the sweep and shut down after it; a Ray the caller already started, or a cluster
at `address`, is used as it is. Never `ray stop`: it stops every Ray process on the machine.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from compressor.errors import BackendUnavailableError, UsageError

LOCAL_CPUS = 2
SOCKET_PATH_BYTES = 107
RAY_SOCKET_SUFFIX_BYTES = 80   # cz-ray-XXXXXXXX/session_<date>_<us>_<pid>/sockets/plasma_store


def run_on_ray(run_one: Callable[..., list[dict[str, Any]]], model: Any, recipes: Sequence[Any],
               data: Any, out: Path, address: str | None,
               **options: Any) -> list[list[dict[str, Any]]]:
    """`run_one(model, recipe, data, out, **options)` (sweep.sweep_one) as one Ray task per
    recipe; each recipe's rows in the order of `recipes`, a task that crashed a row with its
    error."""
    if not address:   # read when ray is first imported: a local node on 127.0.0.1
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = _import_ray()
    with _ray_session(ray, address):
        try:
            model_ref = ray.put(model)
        except Exception as exc:   # an in-memory model Ray cannot pickle
            raise UsageError(f"Ray cannot send the model to its workers ({type(exc).__name__}: "
                             f"{exc}); give the model as a file path (.keras, .pt2, .onnx) or "
                             "module:function") from None
        task = ray.remote(num_cpus=1, max_retries=0)(_run_recipe)
        pending = {task.remote(run_one, model_ref, ref, data, str(out.resolve()), options): index
                   for index, ref in enumerate(recipes)}
        results: dict[int, list[dict[str, Any]]] = {}
        started = time.perf_counter()
        while pending:
            (done,), _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done)
            results[index] = _task_rows(ray, done, recipes[index])
            _progress_line(len(results), len(recipes), results[index], started)
    return [results[index] for index in range(len(recipes))]


def _run_recipe(run_one: Callable[..., Any], model: Any, ref: Any, data: Any, out: str,
                options: dict[str, Any]):
    return run_one(model, ref, data, Path(out), **options)


def _task_rows(ray, done, ref: Any) -> list[dict[str, Any]]:
    try:
        return ray.get(done)
    except Exception as exc:   # the worker raised or died: this recipe's row, not the sweep
        name = str(getattr(ref, "name", ref))
        cause = getattr(exc, "cause", None) or exc
        return [{"recipe": name, "passed": False, "cached": False,
                 "error": f"Ray task failed: {type(cause).__name__}: {cause}"}]


def _progress_line(finished: int, total: int, rows: list[dict[str, Any]], started: float):
    row = rows[0]
    state = ("cached" if row.get("cached") else "error" if row.get("error")
             else "passed" if row.get("passed") else "failed the gate")
    print(f"[{finished}/{total}] {row['recipe']}: {state} ({time.perf_counter() - started:.1f} s)",
          file=sys.stderr, flush=True)


@contextlib.contextmanager
def _ray_session(ray, address: str | None) -> Iterator[str | None]:
    """Yields the temp dir of a Ray started here (removed on exit), else None."""
    if ray.is_initialized():       # the caller's Ray: theirs to shut down
        yield None
        return
    if address:
        ray.init(address=address, log_to_driver=False)
        try:
            yield None
        finally:
            ray.shutdown()
        return
    # Ray advertises the host address unless told otherwise; keep a local sweep on loopback.
    temp = _short_temp_dir()
    try:
        ray.init(num_cpus=LOCAL_CPUS, _node_ip_address="127.0.0.1", _temp_dir=temp,
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
        yield temp
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _short_temp_dir() -> str:
    """A fresh temp dir short enough for Ray's unix sockets (<temp>/session_<date>_<pid>/
    sockets/plasma_store must fit 107 bytes): the usual temp dir, or /tmp when that is deep."""
    base = tempfile.gettempdir()
    if len(base) > SOCKET_PATH_BYTES - RAY_SOCKET_SUFFIX_BYTES and Path("/tmp").is_dir():
        base = "/tmp"
    return tempfile.mkdtemp(prefix="cz-ray-", dir=base)


def _pythonpath() -> str:
    """The driver's import path for compressor first, so local workers run the same code."""
    package_root = str(Path(__file__).resolve().parent.parent)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([package_root, *rest]))


def _import_ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailableError("executor='ray' needs Ray: pip install 'compressor[ray]' "
                                      "(or use the default serial executor)") from None
    return ray
