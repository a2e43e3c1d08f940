"""Language-model metrics from teacher-forced outputs, the same for torch and every runtime.

A model's outputs on token windows [N, T] are `next_token` (argmax at each position, [N, T])
and `token_logprob` (log-probability of each actual next token, [N, T-1]): enough for
perplexity and agreement, and far smaller than the [N, T, vocab] logits.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from compressor.decoders.outputs import GREEDY, NEXT_TOKEN, TOKEN_LOGPROB  # noqa: F401  (the keys, for callers)
from compressor.errors import DataError



def perplexity(outputs: Mapping[str, np.ndarray]) -> float:
    """exp of the mean negative log-likelihood of the held-out tokens."""
    if not isinstance(outputs, Mapping) or TOKEN_LOGPROB not in outputs:
        raise DataError("the perplexity metric is for language models (token windows in, "
                        "next-token log-probabilities out); use accuracy, fidelity or mse")
    return float(np.exp(-np.mean(np.asarray(outputs[TOKEN_LOGPROB], dtype=np.float64))))


def increase(baseline: float, value: float) -> float:
    """Relative perplexity increase: 0.05 = 5% higher than the original model's."""
    return value / baseline - 1.0


def top1_agreement(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """The fraction of held-out positions where the artifact's next-token choice equals the
    original model's (teacher-forced: both read the same prefix)."""
    return float(np.mean(np.asarray(outputs[NEXT_TOKEN]) == np.asarray(reference[NEXT_TOKEN])))


def greedy_agreement(generated: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
    """The fraction of greedily generated tokens equal to the original model's, position by
    position (after a first difference the texts usually part, which this counts as it is)."""
    pairs = [(a, b) for got, want in zip(generated, reference) for a, b in zip(got, want)]
    total = sum(len(want) for want in reference)
    return float(sum(a == b for a, b in pairs) / total) if total else 1.0
