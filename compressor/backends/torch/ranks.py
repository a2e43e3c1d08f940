"""Data-parallel ranks of a PyTorch training run (torchrun; gloo on CPU tensors).

`data_parallel` joins the process group a torchrun rank belongs to. The classic loop
(train.py) then wraps its model in DistributedDataParallel; the language-model loop
(backends/llm/lm_train.py) calls a model through loss closures, so it uses the two
collectives DDP would: one start for every rank, and gradients summed after each backward.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

import torch


def data_parallel() -> bool:
    """Whether this process is one rank of a process group of 2+ ranks; a torchrun rank
    (WORLD_SIZE in the environment) joins the group here, with gloo (CPU tensors)."""
    distributed = torch.distributed
    if not distributed.is_available():
        return False
    if not distributed.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        distributed.init_process_group("gloo")
    return distributed.is_initialized() and distributed.get_world_size() > 1


def rank_and_size() -> tuple[int, int]:
    """(this rank, the number of ranks); (0, 1) outside a process group."""
    if not data_parallel():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def same_start(parameters: Iterable[torch.Tensor]) -> None:
    """Rank 0's values in every rank's `parameters` (what DDP does when it wraps a model)."""
    with torch.no_grad():
        for parameter in parameters:
            torch.distributed.broadcast(parameter.data, src=0)


def summed_gradients(parameters: Iterable[torch.Tensor]) -> None:
    """Each gradient replaced by its sum over the ranks (each rank weighted its loss by its
    share of the batch, so the sum is the whole batch's gradient)."""
    for parameter in parameters:
        if parameter.grad is not None:
            torch.distributed.all_reduce(parameter.grad)


def summed(value: float) -> float:
    """A number summed over the ranks."""
    total = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(total)
    return float(total[0])
