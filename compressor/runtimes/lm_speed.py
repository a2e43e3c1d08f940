"""What the two LM speed children share (genai_speed.py, litert_lm_speed.py): the token counts
that fit the artifact's context, the timing loop, the JSON line they print, and the parent's
side that runs one and reads it back.

Each child times one artifact in a process of its own, so its peak RSS is what loading and
generating cost (no torch, no compress run around it). The result: prefill_ms (the best of
PREFILL_REPEATS prefills into a fresh cache), decode_tokens_per_s (`decode` greedy steps after
that prefill), peak_rss_bytes (VmHWM of the child), threads, prefill_tokens, decode_tokens.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from compressor.errors import ModelLoadError
from compressor.core.memory import own_peak_rss_bytes

PREFILL_REPEATS = 3


def fitting_counts(context: int, prefill: int, decode: int) -> tuple[int, int]:
    """(prefill, decode) capped so that both fit the artifact's context."""
    prefill = max(1, min(prefill, context - 1, max(context - decode, context // 2)))
    return prefill, max(1, min(decode, context - prefill))


def timed(reset: Callable[[], Any], prefill: Callable[[], Any], decode_step: Callable[[], Any],
          decode: int, threads: int | None, prefill_tokens: int) -> dict:
    """Time `prefill()` after an untimed `reset()` (a fresh cache; the best of PREFILL_REPEATS
    kept), then `decode` calls of `decode_step()` after the last prefill."""
    times = []
    for _ in range(PREFILL_REPEATS):
        reset()
        start = time.perf_counter()
        prefill()
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(decode):
        decode_step()
    seconds = time.perf_counter() - start
    return {"prefill_ms": round(min(times) * 1000, 3),
            "decode_tokens_per_s": round(decode / seconds, 3),
            "peak_rss_bytes": own_peak_rss_bytes(), "threads": threads,
            "prefill_tokens": int(prefill_tokens), "decode_tokens": int(decode)}


def child_main(measure: Callable[[str, int | None, int, int], dict], description: str,
               argv: list[str] | None = None) -> int:
    """The child's command line: ARTIFACT --threads N --prefill P --decode D -> one JSON line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("artifact")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=64)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.artifact, args.threads, args.prefill, args.decode)))
    return 0


def run_child(module: str, artifact: Any, threads: int | None, prefill: int, decode: int,
              runtime: str) -> dict:
    """The parent's side: `python -m module` on the artifact, its JSON line read back."""
    command = [sys.executable, "-m", module, str(artifact), "--threads", str(threads),
               "--prefill", str(prefill), "--decode", str(decode)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelLoadError(f"{artifact}: the {runtime} speed run failed ({tail})")
    return json.loads(lines[-1])
