"""The `host` device profile: this machine, measured rather than looked up, so a plan's
speed bound can be set beside a run measured here.

Memory bandwidth: a copy of a 32 MiB float32 buffer, split over one thread per core (numpy
releases the GIL while copying), best of a few rounds; a copy reads and writes each byte, so
bandwidth = 2 x bytes / seconds. Compute: a float32 matmul's best rate; int8 is taken as 2x
that and fp16 as 1x (x86 CPUs without AMX have no faster fp16 path; VNNI doubles int8).
Memory: the RAM installed, and what is free now for an LLM (MemAvailable, at most 90% of it).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

_COPY_BYTES = 32 * 2**20
_ROUNDS = 4


def copy_bandwidth(threads: int | None = None, nbytes: int = _COPY_BYTES, rounds: int = _ROUNDS) -> float:
    """Bytes/s moved by copying a buffer in parallel chunks (best of `rounds`)."""
    import numpy as np

    threads = threads or os.cpu_count() or 1
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    chunks = np.array_split(np.arange(src.size), threads)
    bounds = [(c[0], c[-1] + 1) for c in chunks if c.size]

    def copy(bound: tuple[int, int]) -> None:
        np.copyto(dst[bound[0]:bound[1]], src[bound[0]:bound[1]])

    best = float("inf")
    with ThreadPoolExecutor(max_workers=len(bounds)) as pool:
        for _ in range(rounds):
            start = time.perf_counter()
            list(pool.map(copy, bounds))
            best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def matmul_flops(n: int = 512, rounds: int = 3) -> float:
    import numpy as np

    a = np.ones((n, n), dtype=np.float32)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _memory() -> tuple[int, int]:
    """(installed RAM, available now) in bytes."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except ImportError:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        available = total
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        available = int(line.split()[1]) * 1024
        except OSError:
            pass
        return total, available


@lru_cache(maxsize=1)
def host_measurements() -> dict:
    """This machine's profile keys (devices.get_profile("host") builds the profile from them),
    measured once per process (~0.3 s on an idle machine)."""
    import platform

    total, available = _memory()
    flops = matmul_flops()
    return dict(name="host", memory_bytes=total, model_share=0.5, arch=platform.machine() or "unknown",
                runtimes=("litert", "onnxruntime"),
                description=f"this machine ({os.cpu_count()} cores, measured)",
                llm_share=min(0.9, available / total) if total else 0.9,
                memory_bandwidth=copy_bandwidth(), int8_ops=2 * flops, fp16_ops=flops,
                network_bandwidth=125e6)
