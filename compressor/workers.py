"""`compress --workers N`: the same command under torchrun, N local ranks, rank 0 writes --out.

torchrun (`python -m torch.distributed.run --standalone`) starts the ranks; each runs the whole
`compress` command, and the PyTorch backend's training loop joins the process group (gloo, on
loopback unless GLOO_SOCKET_IFNAME says otherwise) so fine-tuning is data-parallel. Ranks other
than 0 write their artifacts into a temp dir that is removed: one `--out`. No framework import
here; torch is a subprocess.
"""
from __future__ import annotations

import os
import subprocess
import sys


def launch(workers: int, argv: list[str]) -> int:
    """Run `compress argv` (without --workers) as `workers` torchrun ranks; their exit code."""
    env = {**os.environ}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(workers), "-m", "compressor.cli", *argv]
    return subprocess.run(command, env=env, check=False).returncode


def rank() -> int:
    """This process's rank under torchrun (0 when not distributed)."""
    return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0


def under_launcher() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


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
