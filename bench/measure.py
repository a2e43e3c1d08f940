"""Whole-process measurements: wall time, CPU time and peak RSS of one child, artifact sizes.

Peak RSS and CPU time come from os.wait4's rusage for that one child (on Linux these also
cover the child's own waited-for children), so no psutil and no /usr/bin/time.
"""
from __future__ import annotations

import gzip
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@dataclass
class ProcessRun:
    cmd: list[str]
    returncode: int
    wall_s: float
    cpu_s: float              # user + system CPU seconds (less sensitive to other load than wall)
    peak_rss_mb: float
    stdout: str
    stderr_tail: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def summary(self) -> dict:
        data = asdict(self)
        data.pop("stdout")
        data["cmd"] = " ".join(self.cmd)
        data["wall_s"] = round(self.wall_s, 3)
        data["cpu_s"] = round(self.cpu_s, 3)
        data["peak_rss_mb"] = round(self.peak_rss_mb, 1)
        return data


def run_process(cmd: list[str], timeout: float = 900, env: dict | None = None,
                cwd: Path = REPO) -> ProcessRun:
    """Run `cmd` to completion; wall time from spawn to exit, peak RSS from its rusage."""
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"{out_path}.out", "w+b") as out, open(f"{out_path}.err", "w+b") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env,
                                start_new_session=True)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").unlink(missing_ok=True)
    return ProcessRun(cmd=[str(c) for c in cmd], returncode=proc.returncode, wall_s=wall,
                      cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_mb=usage.ru_maxrss / 1024, stdout=stdout,
                      stderr_tail=_tail(stderr), timed_out=killed.is_set())


def _tail(text: str, lines: int = 12) -> str:
    """The last lines of stderr without the frameworks' start-up noise."""
    noise = ("cuda", "cpu_feature_guard", "absl::", "To enable the following", "torchvision",
             "Skipping import of cpp", "_pytree.py", "WARNING: All log")
    kept = [line for line in text.splitlines() if line.strip() and not any(n in line for n in noise)]
    return "\n".join(kept[-lines:])[-2000:]


def error_line(stderr: str) -> str:
    """The line of stderr that says what went wrong: the exception or `error:` line, else the last."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if line.startswith("error:") or (head.endswith(("Error", "Exception")) and " " not in head):
            return line[:400]
    return lines[-1][:400] if lines else "(no output on stderr)"


def python_cmd(*args: str) -> list[str]:
    return [PYTHON, *[str(a) for a in args]]


def compress_cmd(*args: str) -> list[str]:
    """The installed `compress` console script next to this Python (what a user runs)."""
    script = Path(PYTHON).parent / "compress"
    head = [str(script)] if script.exists() else [PYTHON, "-m", "compressor.cli"]
    return head + [str(a) for a in args]


def artifact_files(path: Path) -> list[Path]:
    """The artifact and any external-data files an .onnx refers to (they ship together)."""
    path = Path(path)
    files = [path]
    if path.suffix == ".onnx":
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        locations = set()
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
        files += [path.parent / loc for loc in sorted(locations)]
    return files


def artifact_sizes(path: Path) -> dict:
    """Raw bytes and gzip -9 bytes of everything the artifact needs at run time."""
    files = artifact_files(path)
    blob = b"".join(f.read_bytes() for f in files)
    return {"size_bytes": len(blob), "gzip_bytes": len(gzip.compress(blob, 9, mtime=0)),
            "external_files": [f.name for f in files[1:]]}


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b, digits: int = 4) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def perplexity_increase(perplexity, base) -> float | None:
    """perplexity / base - 1 (5 digits); None when either is missing."""
    return round(perplexity / base - 1, 5) if perplexity and base else None


def increase_ratio(ours, theirs) -> float | None:
    """ours / theirs for two perplexity increases; None where theirs is not above zero."""
    return round(ours / theirs, 4) if ours is not None and theirs and theirs > 0 else None


def worst(values) -> float | None:
    """The largest of the values that are there; None when none is."""
    values = [v for v in values if v is not None]
    return max(values) if values else None
