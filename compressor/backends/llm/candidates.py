"""Which integers a language model gets, chosen on this model by measurement.

A setting tuned on one model made another worse (our bench Llama liked GPTQ with a clip search;
a real 135M checkpoint came out no better than plain rounding), so every quality choice of a
weight-only plan is a candidate, scored on calibration windows the integers were not made from:
- the algorithm: GPTQ (in input order, or in order of input energy on static groups), or
  round to nearest (clip search weighted by the inputs' mean square), all from one pass over
  the layers (quantize.quantize_candidates), with `algorithm: auto`;
- which matrices stay at int8 within the recipe's byte budget (mixed.py): none, or the
  costliest in each of mixed.ORDERS.
The score is the mean KL divergence of the candidate's next-token distribution from the float
model's, per token (0: the same model); the lowest wins. report.json `candidates` has an entry
(step "quantize") listing every candidate's score and settings, and the winner. The group size
and the grid stay as the recipe says: they set the bytes the planner counted.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

import compressor.backends.llm.mixed as mixed
from compressor.formats import format_named, resolve
from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.backends.llm.layer_inputs import CALIBRATION_BATCH
from compressor.backends.llm.quantize import (WeightOnlyPlan, computing_with, progress,
                                              quantize_candidates)

# auto: GPTQ in order of input energy (static groups), GPTQ in input order, round to nearest;
# the first one's integers feed the next layers' inputs. Measured (KL from float, all int4):
# SmolLM2-135M 0.154 / 0.203 / 0.310; the bench's trained Llama 0.0160 / 0.0148 / 0.0192 and
# Qwen2 0.0070 / 0.0068 / 0.0088: each wins somewhere, so each is tried.
ALGORITHMS = ("gptq_act_order", "gptq", "rtn")
HELD_OUT_SHARE = 4              # 1 in 4 calibration windows scores, when there are 8 or more
MIN_WINDOWS_TO_SPLIT = 8
REFERENCE_CACHE_BYTES = 256 * 2**20


@dataclass
class Variant:
    """One candidate: its integers are made when it is scored (`make`) and dropped after
    unless it is the best so far, so a 7B model's candidates never sit in memory together."""

    name: str
    algorithm: str
    make: Callable[[], dict[str, QuantizedLinear]]
    int8: list[str] = field(default_factory=list)
    bytes: int = 0
    kl_by_format: dict[str, float] = field(default_factory=dict)

    @property
    def kl(self) -> float:
        return max(self.kl_by_format.values())


def choose_weights(loaded: LoadedLm, plan: WeightOnlyPlan, calibration: np.ndarray | None,
                   task: Any = None, info: Any = None, formats: tuple[str, ...] = ("onnx",)
                   ) -> tuple[dict[str, QuantizedLinear], dict[str, Any] | None]:
    """(the winning integers, the record report.json keeps as a `candidates` entry; None when
    there was one candidate only). Each candidate is scored as every format in `formats`
    computes it (a .tflite rounds integers off LiteRT's grids again: litert_grid.as_computed)
    and judged on the worst. `info(line)`: where the scores are told."""
    algorithms = ALGORITHMS if plan.algorithm == "auto" else (plan.algorithm,)
    fit, scoring = split(calibration)
    mixing = plan.bits == 4 and plan.int8_budget > 1.0
    made = quantize_candidates(loaded, replace(plan, algorithm=algorithms[0]), fit, algorithms,
                               task, measure=mixing)
    floats = _float_matrices(loaded.model) if mixing or plan.bits == 8 else {}
    variants = []
    for algorithm, candidate in made.items():
        variants.append(Variant(algorithm, algorithm, lambda c=candidate: c.weights))
        if mixing:
            variants += _mixes(algorithm, candidate, plan.int8_budget, floats,
                               _token_tables(loaded.model))
    if plan.bits == 8:   # per row, symmetric: what LiteRT's int8 kernels store exactly
        first = made[algorithms[0]].weights
        variants.append(Variant(f"{algorithms[0]}_rows", algorithms[0],
                                lambda: mixed.int8_rows_for(first, floats)))
        for block in sorted({format_named(f).lm_int8_block for f in formats} - {0}):
            variants.append(Variant(f"{algorithms[0]}_blocks{block}", algorithms[0],
                                    lambda b=block: mixed.int8_blocks_for(first, floats, b)))
    if len(variants) == 1:
        return variants[0].make(), None
    if scoring is None:   # no windows to score on: the first algorithm, mixed by output error
        kept = variants[1] if mixing else variants[0]
        for variant in variants:
            variant.bytes = _bytes(variant.make())
        return kept.make(), _record(variants, kept, None, calibration)
    with progress(task, "score candidates", len(variants)) as advance:
        best, best_weights = _scored(loaded.model, variants, scoring, formats, advance)
    if info is not None:
        info("quantize: candidates (mean KL from the float model, lower is closer): " + ", ".join(
            f"{v.name} {v.kl:.4g}" for v in variants) + f"; kept {best.name}")
    return best_weights, _record(variants, best, scoring, calibration)


def _mixes(algorithm: str, candidate: Any, budget: float, floats: dict[str, torch.Tensor],
           tables: frozenset[str]) -> list[Variant]:
    """The candidate with int8 bought in each of mixed.ORDERS (a pick another order made
    already is not tried twice)."""
    spare = mixed.spare_bytes(candidate.weights, budget)
    found = mixed.units(candidate.weights, candidate.errors)
    variants: list[Variant] = []
    picks: list[set[str]] = []
    for order in mixed.ORDERS:
        picked = mixed.chosen(found, spare, order, tables)
        if picked and {u.name for u in picked} not in picks:
            picks.append({u.name for u in picked})
            variants.append(Variant(
                f"{algorithm}+int8_by_{order}", algorithm,
                lambda picked=picked: mixed.with_int8(
                    candidate.weights, [p for unit in picked for p in unit.params], floats),
                [unit.name for unit in picked]))
    return variants


def _scored(model: Any, variants: list[Variant], windows: np.ndarray, formats: tuple[str, ...],
            advance: Callable[[int], None]) -> tuple[Variant, dict[str, QuantizedLinear]]:
    """Each variant's KL per format, made and scored one at a time; the best and its weights."""
    scorer = KlScorer(model, windows)
    best, best_weights = None, {}
    for variant in variants:
        weights = variant.make()
        variant.bytes = _bytes(weights)
        variant.kl_by_format = scores_by_format(scorer, weights, formats)
        if best is None or variant.kl < best.kl:
            best, best_weights = variant, weights
        advance(1)
    return best, best_weights


def scores_by_format(scorer: KlScorer, weights: dict[str, QuantizedLinear],
                     formats: tuple[str, ...]) -> dict[str, float]:
    """format -> the KL of `weights` as that format's runtime computes them: the integers as
    they are unless its registry entry names how its runtime changes them (Format.lm_weights:
    a .tflite rounds other grids again; Format.lm_activations: it rounds the matrices' inputs
    too). Formats computing exactly the integers share one score."""
    scores: dict[str, float] = {}
    as_stored = None
    for fmt in formats or ("any",):
        entry = format_named(fmt) if fmt != "any" else None
        view = resolve(entry.lm_weights) if entry and entry.lm_weights else None
        inputs = input_rounding(fmt) if entry else None
        computed = weights if view is None else {name: view(w) for name, w in weights.items()}
        if inputs is None and all(computed[name] is w for name, w in weights.items()):
            as_stored = scorer(weights) if as_stored is None else as_stored
            scores[fmt] = as_stored
            continue
        scores[fmt] = scorer(computed, inputs)
    return scores


def input_rounding(fmt: str) -> Callable[..., Any] | None:
    """How `fmt`'s runtime rounds a quantized matrix's input (Format.lm_activations, resolved:
    `(model, names, straight_through=False)` -> a context), None when it computes in float."""
    reference = format_named(fmt).lm_activations
    return resolve(reference) if reference else None


def split(calibration: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(windows the integers are made from, windows that score them; the same windows when
    there are too few to split)."""
    if calibration is None or len(calibration) < MIN_WINDOWS_TO_SPLIT:
        return calibration, calibration
    held = len(calibration) // HELD_OUT_SHARE
    return calibration[:-held], calibration[-held:]


def _bytes(weights: dict[str, QuantizedLinear]) -> int:
    return sum(mixed.onnx_bytes(w) for w in weights.values())


def _record(variants: list[Variant], best: Variant, scoring: np.ndarray | None,
            calibration: np.ndarray | None) -> dict[str, Any]:
    first_bytes = variants[0].bytes   # all matrices at the recipe's bits
    held_out = scoring is not None and calibration is not None and len(scoring) < len(calibration)
    scored_on = ("nothing (no calibration windows): the first candidate mixed by output error"
                 if scoring is None else
                 f"{len(scoring)} {'held-out ' if held_out else ''}calibration windows of "
                 f"{scoring.shape[1]} tokens: mean KL(float || candidate) per token, lower is closer")
    return {"artifact": "all", "step": "quantize", "scored_on": scored_on, "winner": best.name,
            "tried": [{"name": v.name, "score": v.kl if v.kl_by_format else None,
                       "by_format": v.kl_by_format or None, "settings": {
                           "algorithm": v.algorithm, "int8": v.int8,
                           "bytes_ratio": round(v.bytes / first_bytes, 4)}}
                      for v in variants]}


def _float_matrices(model: Any) -> dict[str, torch.Tensor]:
    """Parameter name -> the model's float weight as [N, K] (a Conv1D's transposed back)."""
    from transformers.pytorch_utils import Conv1D

    transposed = {f"{name}.weight" for name, module in model.named_modules()
                  if isinstance(module, Conv1D)}
    return {name: param.T if name in transposed else param
            for name, param in model.named_parameters(remove_duplicate=False)
            if param.dim() == 2}


def _token_tables(model: Any) -> frozenset[str]:
    """The parameter names of the input embedding and the lm_head (one matrix when tied)."""
    wanted = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return frozenset(name for name, param in model.named_parameters(remove_duplicate=False)
                     if id(param) in wanted)


class KlScorer:
    """Mean KL(float || candidate) per predicted token on `windows`: sum p (log p - log q) over
    the vocabulary. The float model's p (float16) and its sum p log p are kept when p takes at
    most REFERENCE_CACHE_BYTES (SmolLM's 49k vocabulary over 8 x 256 tokens: 200 MB), else
    computed again beside each candidate's."""

    def __init__(self, model: Any, windows: np.ndarray):
        self.model = model
        self.batches = [torch.as_tensor(windows[start:start + CALIBRATION_BATCH])
                        for start in range(0, len(windows), CALIBRATION_BATCH)]
        vocabulary = model.get_output_embeddings().weight.shape[0]
        self.cache: list[tuple[torch.Tensor, float]] | None = \
            [] if windows.size * vocabulary * 2 <= REFERENCE_CACHE_BYTES else None

    def _reference(self, index: int) -> tuple[torch.Tensor, float]:
        """(p, sum p log p) of the float model on batch `index`."""
        if self.cache is not None and index < len(self.cache):
            return self.cache[index]
        log_p = _log_probs(self.model, self.batches[index])
        p = log_p.exp()
        found = (p.to(torch.float16) if self.cache is not None else p, float((p * log_p).sum()))
        if self.cache is not None:
            self.cache.append(found)
        return found

    def __call__(self, weights: dict[str, QuantizedLinear],
                 inputs: Callable[..., Any] | None = None) -> float:
        """The KL of the model computing with `weights`; `inputs(model, names)`: a context in
        which the quantized matrices' inputs are rounded as a runtime does
        (Format.lm_activations), around the candidate's forward only."""
        def log_q(batch: torch.Tensor) -> torch.Tensor:
            with computing_with(self.model, weights), \
                    inputs(self.model, weights) if inputs else contextlib.nullcontext():
                return _log_probs(self.model, batch)

        return self.kl(log_q)

    def kl(self, log_q_of: Callable[[torch.Tensor], torch.Tensor]) -> float:
        """The mean KL of any model from the float one: `log_q_of(batch)` gives its
        log-probabilities [B, T, vocab] on a batch of the windows (int64 [B, T])."""
        total, tokens = 0.0, 0
        with torch.no_grad():
            for index, batch in enumerate(self.batches):
                p, p_log_p = self._reference(index)
                log_q = log_q_of(batch)
                total += p_log_p - float((p.to(torch.float32) * log_q).sum())
                tokens += log_q.shape[0] * log_q.shape[1]
        return total / tokens


def kl_from_float(model: Any, candidates: list[dict[str, QuantizedLinear]],
                  windows: np.ndarray) -> list[float]:
    """KlScorer's score of each candidate."""
    scorer = KlScorer(model, windows)
    return [scorer(weights) for weights in candidates]


def _log_probs(model: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch, use_cache=False).logits
    return torch.log_softmax(logits.to(torch.float32), dim=-1)
