"""torch's thread count for heavy CPU work (training, GPTQ): the CPUs other processes leave free.

Why: torch's intra-op threads wait for each other at every op. On a machine where another
process keeps a core busy, two threads on two cores ran the bench Llama's int4 QAT 30x slower
than one (201 s for 32 steps instead of 7 s; every op waits a scheduler slice for the thread
that lost its core), and a 135M model's int4 run 6x slower. One thread per free CPU avoids it.

Free CPUs are measured, not guessed from the load average: the machine's busy time over a
short window while this process sleeps, less its own threads' (the 1-minute load average also
counts this process's own threads of the last minute, so a run that had used two would then
take one). A step reads it once, at its start.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

WINDOW_S = 0.1    # how long the machine's busy time is sampled (10 ticks of a busy core)


def free_cpus(window: float = WINDOW_S) -> int:
    """CPUs this process may use, less those other processes keep busy now (at least 1)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cpus == 1:
        return 1
    before = _busy_seconds()
    if before is None:      # no /proc/stat: the load average, this process counted as one
        return max(1, cpus - max(0, round(os.getloadavg()[0]) - 1))
    own = _own_seconds()
    time.sleep(window)
    # less this process's own threads (torch's pool spinning down, samplers) meanwhile
    busy = (_busy_seconds() or before) - before - (_own_seconds() - own)
    return max(1, min(cpus, cpus - round(busy / window)))


@contextlib.contextmanager
def on_free_cpus() -> Iterator[int]:
    """Inside: torch runs on the free CPUs, never more threads than it had (a caller's
    torch.set_num_threads(1) stands); the count is restored on leaving. Yields the count."""
    import torch

    before = torch.get_num_threads()
    threads = min(before, free_cpus())
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O)."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
