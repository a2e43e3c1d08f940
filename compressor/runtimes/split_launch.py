"""Rank 0's side of starting and ending the stage processes of a split model
(runtimes/split_stages.py serves a stage): the TCPStore every rank meets at, the K-1 local
stage processes in one-machine mode, waiting until each says `ready/k` (or `error/k`), naming
the stage that failed, and a teardown that leaves no process behind.

A local stage process dies with its parent (PR_SET_PDEATHSIG on Linux) and writes its stderr
to a log of its own, so a failure reaches the user as rank 0's one `error:` line.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compressor.errors import CompressorError
from compressor.runtimes.split_stages import PEER_LOST, connect

POLL_S = 0.05
GRACE_S = 1.0            # after a failure: time for the other stages to report what they saw
STOP_S = 3.0             # a stopped stage's time to exit before it is killed


class StageError(CompressorError):
    """A stage of a split model could not start, or died: the run ends (exit 2)."""


def _die_with_parent() -> None:   # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        return


class Stages:
    """The store, the local stage processes (one-machine mode) and their fate."""

    def __init__(self, folder: Path, world: int, host: str, port: int, timeout: float,
                 local: bool, threads: int | None):
        self.folder, self.world, self.timeout, self.local = Path(folder), world, timeout, local
        self.children: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, Path] = {}
        self.store = connect(host, port, world, timeout, master=True)
        self.address = f"{host}:{self.store.port}"
        if local:
            self._logdir = tempfile.mkdtemp(prefix="compressor-split-")
            for rank in range(1, world):
                self._spawn(rank, threads)

    def _spawn(self, rank: int, threads: int | None) -> None:
        log = Path(self._logdir) / f"stage{rank}.log"
        command = [sys.executable, "-m", "compressor.runtimes.split_stages", str(self.folder),
                   "--rank", str(rank), "--master", self.address, "--timeout", str(self.timeout)]
        if threads:
            command += ["--threads", str(threads)]
        with open(log, "wb") as sink:
            self.children[rank] = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        self.logs[rank] = log

    def pids(self) -> list[int]:
        return [child.pid for child in self.children.values()]

    def _key(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:   # noqa: BLE001  (a store that is going away answers nothing)
            return None

    def wait_ready(self, seconds: float) -> None:
        """Until every stage 1..K-1 said ready; StageError naming the first that cannot."""
        deadline = time.monotonic() + seconds
        waiting = set(range(1, self.world))
        while waiting:
            for rank in sorted(waiting):
                reason = self._key(f"error/{rank}")
                if reason is not None:
                    raise StageError(f"stage {rank} cannot start: {reason}")
                child = self.children.get(rank)
                if child is not None and child.poll() is not None:
                    raise StageError(f"stage {rank} exited (code {child.returncode}) before it "
                                     f"was ready: {self._log_tail(rank)}")
                if self._key(f"ready/{rank}") is not None:
                    waiting.discard(rank)
            if waiting and time.monotonic() > deadline:
                ranks = ", ".join(str(r) for r in sorted(waiting))
                hint = "" if self.local else (
                    f"; start `compress stage {self.folder} --rank K --master {self.address}` "
                    "on each board")
                raise StageError(f"stage {ranks} did not start within {seconds:g} s{hint}")
            time.sleep(POLL_S)

    def failure(self, exc: BaseException) -> StageError:
        """The StageError for a run that broke (gloo raised `exc`): the stage that died or
        failed, not one that only lost its neighbour."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(c.poll() is None for c in self.children.values()):
            time.sleep(POLL_S)
        for rank in range(1, self.world):
            reason = self._key(f"error/{rank}")
            if reason is not None:
                return StageError(f"stage {rank} failed: {reason}")
        for rank, child in sorted(self.children.items()):
            code = child.poll()
            if code is not None and code not in (0, PEER_LOST):
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                return StageError(f"stage {rank} died ({how}); the run stopped")
        for rank in range(1, self.world):
            if self._key(f"lost/{rank}") is None:
                return StageError(f"stage {rank} stopped answering ({str(exc).strip()[:160]})")
        return StageError(f"the pipeline broke ({str(exc).strip()[:160]})")

    def _log_tail(self, rank: int) -> str:
        try:
            lines = self.logs[rank].read_text(errors="replace").strip().splitlines()
        except (OSError, KeyError):
            return "no output"
        errors = [line for line in lines if line.startswith("error:")]
        return (errors or lines or ["no output"])[-1][:300]

    def close(self) -> None:
        """Wait briefly for the stages to exit (after STOP), then end any still running."""
        deadline = time.monotonic() + STOP_S
        for child in self.children.values():
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.terminate()
        for child in self.children.values():
            try:
                child.wait(STOP_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.children = {}
        if self.local and os.path.isdir(getattr(self, "_logdir", "")):
            import shutil

            shutil.rmtree(self._logdir, ignore_errors=True)
        self.store = None
