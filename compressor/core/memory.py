"""What a run costs in memory, and handing memory back.

`peak_rss_bytes()` (report.json `compress_peak_rss_bytes`) is the peak of the summed resident
memory of this process and all its children at the same moments: a sampling thread reads the
RSS of this process and of its children every SAMPLE_S seconds (the list of children is
refreshed every CHILDREN_S: finding them means reading every process's /proc stat), from
`start_sampling()` on. getrusage's peaks are exact for one process each but cannot be added
(the parent's and a child's peaks fall at different moments), and their max understates what
the machine needs while a child runs beside a large parent; the reported value is the sampled
tree peak, never below either getrusage peak (a spike between two samples).

`release_file_pages` hands back the pages of a memory-mapped checkpoint's tensor (a private
file mapping: the pages hold the file's bytes, and are read from the file again if touched);
`trim_heap` returns freed heap memory to the system (glibc keeps it otherwise);
`heap_in_use()` is what malloc holds for live objects (report.json `training`
`peak_heap_increase_bytes`); `run_objects_only()` keeps the objects that existed before a run
out of its collections.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import mmap
import os
import resource
import sys
import threading
import time
from pathlib import Path

SAMPLE_S = 0.025
CHILDREN_S = 0.5
PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4     # Linux: drop the pages; a private file mapping reads them again


class TreeRssSampler(threading.Thread):
    """Samples the summed RSS of process `pid` and its descendants; `peak` is the largest sum."""

    def __init__(self, pid: int | None = None, interval: float = SAMPLE_S):
        super().__init__(name="compressor-rss", daemon=True)
        self.pid = pid or os.getpid()
        self.interval = interval
        self.peak = 0
        self._children: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        refreshed = 0.0
        while not self._stop_event.is_set():
            now = time.monotonic()
            if now - refreshed >= CHILDREN_S:
                self._children = descendants(self.pid)
                refreshed = time.monotonic()
            self.sample()
            self._stop_event.wait(self.interval)

    def sample(self) -> int:
        total = sum(rss_of(pid) for pid in (self.pid, *self._children))
        self.peak = max(self.peak, total)
        return total

    def stop(self) -> None:
        self._stop_event.set()

    @property
    def stopped(self) -> bool:
        return self._stop_event.is_set() or not self.is_alive()


_SAMPLER: TreeRssSampler | None = None
_LOCK = threading.Lock()


def start_sampling() -> None:
    """Start sampling this process tree's RSS for a run (a sampler already running goes on)."""
    global _SAMPLER
    if not sys.platform.startswith("linux"):
        return
    with _LOCK:
        if _SAMPLER is None or _SAMPLER.pid != os.getpid() or _SAMPLER.stopped:
            _SAMPLER = TreeRssSampler()
            _SAMPLER.start()


def stop_sampling() -> None:
    """Stop the sampler once the run's report has its peak (a notebook's process lives on);
    the peak stays readable until the next start."""
    with _LOCK:
        if _SAMPLER is not None:
            _SAMPLER.stop()


def peak_rss_bytes() -> int:
    """The peak summed RSS of this process and its children since start_sampling() (see the
    module docstring), and never below getrusage's own peak of this process or of its
    largest child."""
    peaks = [1024 * resource.getrusage(who).ru_maxrss
             for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    sampler = _SAMPLER
    if sampler is not None and sampler.pid == os.getpid():
        sampler.sample()
        peaks.append(sampler.peak)
    return max(peaks)


def own_peak_rss_bytes() -> int:
    """This process's peak RSS since it started its program: VmHWM (Linux), which exec resets;
    getrusage's ru_maxrss survives exec, so a child forked from a large compress process would
    report that process's size (the fallback elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_of(pid: int) -> int:
    """Resident bytes of `pid` now (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from each process's parent in /proc/*/stat."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


@contextlib.contextmanager
def run_objects_only():
    """Within: garbage collections (trim_heap's, and Python's own) scan only objects made
    inside, the older ones frozen (gc.freeze). A process that imported TensorFlow, torch and
    transformers holds ~1M objects: each full collection took 0.6 s, four per language-model
    run, for the few cycles the run itself made. The cycles made inside are collected on the
    way out, before the older objects thaw. Left as it is when the caller froze its own."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()


def trim_heap() -> None:
    """Collect garbage and give freed heap memory back to the system (glibc's malloc_trim:
    large frees in the middle of the heap otherwise stay in this process's RSS)."""
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def release_file_pages(address: int, nbytes: int) -> int:
    """Drop this process's resident pages of [address, address + nbytes) if the range lies in
    a private mapping of a file (a memory-mapped checkpoint's tensor; anything else is left
    alone): the values stay the file's, read again if touched. Returns the bytes released."""
    start = -(-address // PAGE) * PAGE
    stop = (address + nbytes) // PAGE * PAGE
    libc = _libc()
    if stop <= start or libc is None or not _in_private_file_mapping(start, stop):
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return stop - start if libc.madvise(start, stop - start, MADV_DONTNEED) == 0 else 0


def _in_private_file_mapping(start: int, stop: int) -> bool:
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= start and stop <= high:
            path = fields[5] if len(fields) == 6 else ""
            return fields[1].endswith("p") and path.startswith("/") and fields[4] != "0"
    return False


@functools.lru_cache(maxsize=1)
def _libc():   # opened once: the training sampler reads mallinfo2 every few milliseconds
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def heap_in_use() -> int | None:
    """Bytes malloc has handed out and not freed (mallinfo2: in use in every arena + mmapped),
    the CPU counterpart of torch.cuda.memory_allocated; None off glibc. RSS also holds what was
    freed but kept (up to glibc's dynamic trim threshold, 64 MB, and holes between chunks)."""
    if (info := _mallinfo2()) is None:
        return None
    got = info()
    return int(got.uordblks + got.hblkhd)


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    """glibc's mallinfo2, its result type set once; None without it (glibc < 2.33, not Linux)."""
    info = getattr(_libc(), "mallinfo2", None)
    if info is not None:
        info.restype = _MallInfo2
    return info


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks "
                "fsmblks uordblks fordblks keepcost".split()]


class _TrainingSampler(TreeRssSampler):
    """The tree's RSS and this process's heap in use, each one's peak. mallinfo2 walks the free
    chunks holding the arena's lock, which training's mallocs wait for (1.2 ms a call on the
    bench Llama's heap, 10% of its QAT at 10 ms): samples are HEAP_SPACING x a call apart."""

    HEAP_SPACING = 20

    def __init__(self, interval: float):
        super().__init__(os.getpid(), interval)
        self.heap_peak: int | None = None
        self.base_interval = interval

    def sample(self) -> int:
        started = time.perf_counter()
        heap = heap_in_use()
        if heap is not None:
            self.heap_peak = max(self.heap_peak or 0, heap)
            self.interval = max(self.base_interval,
                                self.HEAP_SPACING * (time.perf_counter() - started))
        return super().sample()


class TrainingMeter:
    """The wall time and peak memory of a training loop, for report.json `training`: `with
    TrainingMeter() as meter: ...`, then `meter.facts()`. 2 ms: small nets' peaks are short."""

    def __init__(self, interval: float = 0.002):
        self.sampler = _TrainingSampler(interval)
        self.before = self.seconds = 0.0
        self.heap_before: int | None = None
        self._started = 0.0

    def __enter__(self) -> TrainingMeter:
        self.before = rss_of(os.getpid())
        self.heap_before = self.sampler.heap_peak = heap_in_use()
        self._started = time.perf_counter()
        self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._started
        self.sampler.stop()
        self.sampler.join()

    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def mark(self) -> None:
        """A sample now, from the loop: after a step's forward, when its activations are all
        alive (the sampler's spaced samples can miss a short run's peaks)."""
        self.sampler.sample()

    def facts(self) -> dict:
        """seconds; the loop's peak RSS (process and children) and its increase over the RSS
        before the loop; the increase of the heap in use (what training itself held at its
        peak: gradients, optimizer state, activations, loss temporaries; None off glibc).
        The RSS increase also counts freed memory malloc kept, which depends on what the
        process did before (the same int4_qat run: 232 to 285 MB RSS, 186 MB heap)."""
        heap = (None if self.heap_before is None or self.sampler.heap_peak is None
                else max(self.sampler.heap_peak - self.heap_before, 0))
        return {"seconds": round(self.seconds, 2), "peak_rss_bytes": self.sampler.peak,
                "peak_rss_increase_bytes": max(self.sampler.peak - int(self.before), 0),
                "peak_heap_increase_bytes": heap}
