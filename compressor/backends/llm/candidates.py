"""Which integers a language model gets, chosen on this model by measurement.

A setting tuned on one model made another worse (our bench Llama liked GPTQ with a clip search;
a real 135M checkpoint came out no better than plain rounding), so every quality choice of a
weight-only plan is a candidate, scored on calibration windows the integers were not made from:
- the algorithm: GPTQ, or round to nearest (clip search weighted by the inputs' mean square),
  both from one pass over the layers (quantize.quantize_candidates), with `algorithm: auto`;
- which matrices stay at int8 within the recipe's byte budget (mixed.py): none, or the
  costliest in each of mixed.ORDERS.
The score is the mean KL divergence of the candidate's next-token distribution from the float
model's, per token (0: the same model); the lowest wins. report.json `candidates` has an entry
(step "quantize") listing every candidate's score and settings, and the winner. The group size
and the grid stay as the recipe says: they set the bytes the planner counted.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

import compressor.backends.llm.mixed as mixed
from compressor.backends.llm.model import LoadedLm, QuantizedLinear
from compressor.backends.llm.layer_inputs import CALIBRATION_BATCH
from compressor.backends.llm.quantize import WeightOnlyPlan, computing_with, quantize_candidates

ALGORITHMS = ("gptq", "rtn")    # auto: GPTQ first (its integers feed the next layers' inputs)
HELD_OUT_SHARE = 4              # 1 in 4 calibration windows scores, when there are 8 or more
MIN_WINDOWS_TO_SPLIT = 8


def choose_weights(loaded: LoadedLm, plan: WeightOnlyPlan, calibration: np.ndarray | None,
                   task: Any = None, info: Any = None, formats: tuple[str, ...] = ("onnx",)
                   ) -> tuple[dict[str, QuantizedLinear], dict[str, Any] | None]:
    """(the winning integers, the record report.json keeps as a `candidates` entry; None when
    there was one candidate only). Each candidate is scored as every format in `formats`
    computes it (a .tflite rounds integers off LiteRT's grids again: litert_grid.as_computed)
    and judged on the worst. `info(line)`: where the scores are told."""
    algorithms = ALGORITHMS if plan.algorithm == "auto" else (plan.algorithm,)
    fit, scoring = _split(calibration)
    mixing = plan.bits == 4 and plan.int8_budget > 1.0
    made = quantize_candidates(loaded, replace(plan, algorithm=algorithms[0]), fit, algorithms,
                               task, measure=mixing)
    floats = _float_matrices(loaded.model) if mixing or plan.bits == 8 else {}
    tables = _token_tables(loaded.model)
    options = []
    for algorithm, candidate in made.items():
        options.append(_option(algorithm, algorithm, candidate.weights, []))
        if mixing:
            options += _mixes(algorithm, candidate, plan.int8_budget, floats, tables)
    if plan.bits == 8:   # per row, symmetric: what LiteRT's int8 kernels store exactly
        options.append(_option(f"{algorithms[0]}_rows", algorithms[0],
                               mixed.int8_rows_for(options[0]["weights"], floats), []))
    if len(options) == 1:
        return options[0]["weights"], None
    if scoring is None:   # no windows to score on: the first algorithm, mixed by output error
        best = options[1] if mixing and len(options) > 1 else options[0]
        return best["weights"], _record(options, best, None, calibration)
    _score(loaded.model, options, scoring, formats)
    best = min(options, key=lambda o: o["kl"])
    if info is not None:
        info("quantize: candidates (mean KL from the float model, lower is closer): " + ", ".join(
            f"{o['name']} {o['kl']:.4g}" for o in options) + f"; kept {best['name']}")
    return best["weights"], _record(options, best, scoring, calibration)


def _mixes(algorithm: str, candidate: Any, budget: float, floats: dict[str, torch.Tensor],
           tables: frozenset[str]) -> list[dict[str, Any]]:
    """The candidate with int8 bought in each of mixed.ORDERS (a pick another order made
    already is not tried twice)."""
    spare = mixed.spare_bytes(candidate.weights, budget)
    found = mixed.units(candidate.weights, candidate.errors)
    options: list[dict[str, Any]] = []
    picks: list[set[str]] = []
    for order in mixed.ORDERS:
        picked = mixed.chosen(found, spare, order, tables)
        if picked and {u.name for u in picked} not in picks:
            picks.append({u.name for u in picked})
            options.append(_option(f"{algorithm}+int8_by_{order}", algorithm,
                                   mixed.with_int8(candidate.weights, picked, floats), picked))
    return options


def _score(model: Any, options: list[dict[str, Any]], windows: np.ndarray,
           formats: tuple[str, ...]) -> None:
    """Each option's `kl` (the worst over the formats) and `kl_by_format`."""
    from compressor.backends.llm.litert_grid import as_computed

    runs: list[tuple[dict, str, dict[str, QuantizedLinear]]] = []
    for option in options:
        weights = option["weights"]
        if "tflite" in formats:
            computed = {name: as_computed(w) for name, w in weights.items()}
            exact = all(computed[name] is w for name, w in weights.items())
            runs.append((option, "tflite", weights if exact else computed))
        if set(formats) - {"tflite"} or not formats:   # ONNX (and GGUF) compute the integers
            runs.append((option, "onnx", weights))
    scores = kl_from_float(model, [weights for _, _, weights in runs], windows)
    for (option, fmt, _), score in zip(runs, scores):
        option.setdefault("kl_by_format", {})[fmt] = score
        option["kl"] = max(option["kl_by_format"].values())


def _split(calibration: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(windows the integers are made from, windows that score them)."""
    if calibration is None or len(calibration) < MIN_WINDOWS_TO_SPLIT:
        return calibration, calibration
    held = len(calibration) // HELD_OUT_SHARE
    return calibration[:-held], calibration[-held:]


def _option(name: str, algorithm: str, weights: dict[str, QuantizedLinear],
            picked: list[mixed.Unit]) -> dict[str, Any]:
    return {"name": name, "algorithm": algorithm, "weights": weights,
            "int8": [unit.name for unit in picked],
            "bytes": sum(mixed.onnx_bytes(w) for w in weights.values())}


def _record(options: list[dict], best: dict, scoring: np.ndarray | None,
            calibration: np.ndarray | None) -> dict[str, Any]:
    first_bytes = options[0]["bytes"]   # all matrices at the recipe's bits
    held_out = scoring is not None and calibration is not None and len(scoring) < len(calibration)
    scored_on = ("nothing (no calibration windows): the first candidate mixed by output error"
                 if scoring is None else
                 f"{len(scoring)} {'held-out ' if held_out else ''}calibration windows of "
                 f"{scoring.shape[1]} tokens: mean KL(float || candidate) per token, lower is closer")
    return {"artifact": "all", "step": "quantize", "scored_on": scored_on,
            "winner": best["name"],
            "tried": [{"name": o["name"], "score": o.get("kl"),
                       "by_format": o.get("kl_by_format"), "settings": {
                           "algorithm": o["algorithm"], "int8": o["int8"],
                           "bytes_ratio": round(o["bytes"] / first_bytes, 4)}}
                      for o in options]}


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


def kl_from_float(model: Any, candidates: list[dict[str, QuantizedLinear]],
                  windows: np.ndarray) -> list[float]:
    """Mean KL(float || candidate) per predicted token on `windows`, for each candidate (the
    float model's distribution computed once per batch)."""
    totals = [0.0] * len(candidates)
    tokens = 0
    with torch.no_grad():
        for start in range(0, len(windows), CALIBRATION_BATCH):
            batch = torch.as_tensor(windows[start:start + CALIBRATION_BATCH])
            reference = _log_probs(model, batch)
            for index, weights in enumerate(candidates):
                with computing_with(model, weights):
                    moved = _log_probs(model, batch)
                totals[index] += float((reference.exp() * (reference - moved)).sum())
            tokens += reference.shape[0] * reference.shape[1]
    return [total / tokens for total in totals]


def _log_probs(model: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch, use_cache=False).logits
    return torch.log_softmax(logits.to(torch.float32), dim=-1)
