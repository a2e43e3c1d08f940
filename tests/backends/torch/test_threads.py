"""torch's threads for training and GPTQ: the CPUs other processes leave free, measured."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from compressor.backends.torch.threads import free_cpus, on_free_cpus

CPUS = len(os.sched_getaffinity(0))


@pytest.fixture
def busy_cpu():
    """A child process spinning on one CPU for the test's duration."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)   # started and spinning
    yield
    child.kill()
    child.wait()


@pytest.mark.skipif(CPUS < 2 or not sys.platform.startswith("linux"), reason="/proc/stat, 2+ CPUs")
def test_a_cpu_another_process_keeps_busy_is_not_free(busy_cpu):
    assert free_cpus() <= CPUS - 1


@pytest.mark.skipif(CPUS < 2 or not sys.platform.startswith("linux"), reason="/proc/stat, 2+ CPUs")
def test_torch_runs_on_the_free_cpus_inside_and_as_before_after(busy_cpu):
    before = torch.get_num_threads()
    with on_free_cpus() as threads:
        assert torch.get_num_threads() == threads <= min(before, CPUS - 1)
    assert torch.get_num_threads() == before


def test_a_callers_thread_count_is_a_ceiling():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with on_free_cpus() as threads:
            assert threads == torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
