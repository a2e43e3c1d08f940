"""`compress --workers N`: the same command as N local data-parallel workers; rank 0 writes --out.

PyTorch models run under torchrun (`python -m torch.distributed.run --standalone`); the
backend's training loop joins the process group (gloo, on loopback unless GLOO_SOCKET_IFNAME
says otherwise). Keras models run as N processes, each with its own TF_CONFIG naming N workers
on 127.0.0.1 (free ports), and train under MultiWorkerMirroredStrategy. Every worker runs the
whole `compress` command; ranks other than 0 work in a temp dir that is removed: one `--out`.
No framework import here; the frameworks run in the subprocesses.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# where this process stands (core/cluster.py), also asked for here by older callers
from compressor.core.cluster import rank, tf_config, tf_config_workers, under_launcher  # noqa: F401
from compressor.core.cluster import EXIT_CODES_ENV, recorded_exit_code

STOP_GRACE_S = 10


def launch(workers: int, argv: list[str], framework: str = "torch") -> int:
    """Run `compress argv` (without --workers) as `workers` local ranks; their exit code.
    The launcher's and ranks' temp files (torchelastic_*, TF's) go into a folder removed after."""
    scratch = tempfile.mkdtemp(prefix="compressor-workers-")
    env = {**os.environ, "TMPDIR": scratch}
    try:
        if framework == "keras":
            return _launch_tf_workers(workers, argv, env)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env[EXIT_CODES_ENV] = tempfile.mkdtemp(prefix="exit-codes-", dir=scratch)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(workers), "-m", "compressor.cli", *argv]
        launcher_code = subprocess.run(command, env=env, check=False).returncode
        return recorded_exit_code(env[EXIT_CODES_ENV], launcher_code)
    finally:
        _remove_all_but_cited_logs(Path(scratch))


def _remove_all_but_cited_logs(scratch: Path) -> None:
    """The scratch folder goes, except logs a rank's error message cites (compressor-logs-*)."""
    for entry in scratch.iterdir():
        if entry.name.startswith("compressor-logs-"):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        scratch.rmdir()   # not empty when a log was kept


def local_tf_configs(workers: int) -> list[str]:
    """One TF_CONFIG per worker: a cluster of `workers` tasks on 127.0.0.1, free ports."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            for i in range(workers)]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _launch_tf_workers(workers: int, argv: list[str], env: dict[str, str]) -> int:
    """Start the workers, wait for all; when one fails the others are stopped (they would
    wait for it in the next collective). Rank 0's exit code unless another rank failed first."""
    command = [sys.executable, "-m", "compressor.cli", *argv]
    procs = [subprocess.Popen(command, env={**env, "TF_CONFIG": config})
             for config in local_tf_configs(workers)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [code for code in codes if code not in (None, 0)]
            if failed or all(code == 0 for code in codes):
                return codes[0] if codes[0] not in (None, 0) else (failed[0] if failed else 0)
            time.sleep(0.2)
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def without_workers(argv: list[str]) -> list[str]:
    """argv minus `--workers N` / `--workers=N`."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            kept.append(arg)
    return kept
