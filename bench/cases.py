"""Every bench case, in one place. Adding a case: write bench/case_<name>.py exporting a
`Case` (bench/case.py), then add it to CASES below.

CASES' order is the order `python -m bench.run` runs them (speed reuses size's artifacts)
and the order of their sections in RESULTS.md.
"""
from __future__ import annotations

from bench.case import Case
from bench import (case_channels, case_cnn_bf16, case_finetune, case_gguf, case_llm,
                   case_llm_train, case_overhead, case_scaling, case_size, case_speed, case_sweep,
                   case_transformer, case_zoo)

CASES = (case_size.CASE, case_speed.CASE, case_overhead.CASE, case_scaling.CASE, case_zoo.CASE,
         case_channels.CASE, case_transformer.CASE, case_sweep.CASE, case_finetune.KD_GAIN,
         case_finetune.PRETRAINED_DROP, case_llm.CASE, case_gguf.CASE, case_llm_train.CASE,
         case_cnn_bf16.CASE)
BY_NAME = {case.name: case for case in CASES}
NAMES = tuple(BY_NAME)

# The targets table lists these cases' targets first, in the order the targets were adopted
# (committed RESULTS.md reads that way); any other case's follow in CASES order.
TARGETS_FIRST = ("size", "zoo", "transformer", "overhead", "scaling", "channels")


def in_targets_order() -> list[Case]:
    rank = {name: i for i, name in enumerate(TARGETS_FIRST)}
    return sorted(CASES, key=lambda case: rank.get(case.name, len(rank)))
