"""Smoothing for runtimes that round a matrix's input at run time (SmoothQuant's migration).

A .tflite rounds every quantized matrix's float input to int8 per token (dynamic_int8.py); a
few channels far larger than the rest (the down projection's inputs above all) set each token's
step and the rest lose their precision. Smoothing divides each such input channel by s and
multiplies the matrix's column by s, folded into whatever writes that channel so the float model
computes the same function:
- a norm feeding the matrices directly (its weight, and bias, divided by s: q/k/v after the
  input norm, gate/up after the post-attention norm);
- else a sibling matrix whose rows write the channel through an elementwise product (the up
  projection of a gated MLP: down(act(gate(x)) * up(x)), up's rows divided by s).
No family is named: the sites are found by following tensors through one short forward, and
each fold is checked on that forward's inputs (the producer's output exactly divided by s, the
MLP's output unchanged): a fold that changes the function (Gemma's 1 + w norm, a gate row
under its activation, a tied head) is undone. s = max|x|**alpha / max|w|**(1 - alpha) per
channel (the SmoothQuant rule), from the calibration windows' inputs.

It is a candidate (the issue's rule: kept where it measures closer), tried only for formats that
round their inputs (Format.lm_activations): the model as it is and each alpha are scored with
round-to-nearest integers, as every such format computes them (worst format); smoothing wins by
a clear lead only (KEEP_BELOW) and then stays applied to the model (new tensors: a checkpoint's
memory-mapped weights are never written), which the quantization and every exporter read.
Measured (SmolLM2-135M, int8 weights, inputs rounded per token, perplexity on the held-out
text): +2.02% as it is, +0.91% smoothed at alpha 0.5.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from compressor.backends.llm.dynamic_int8 import matrix_modules
from compressor.backends.llm.layer_inputs import CALIBRATION_BATCH

ALPHAS = (0.5,)
PROBE_TOKENS = 16          # the structure forward's window (tensors followed, folds checked)
STATS_WINDOWS = 16         # calibration windows the inputs' channel maxima come from
FOLD_TOLERANCE = 1e-3      # relative: a checked output may move this much (float rounding)
S_RANGE = (1e-2, 1e2)
# Smoothing is kept when its score is below this share of the unsmoothed one: the score is a
# round-to-nearest stand-in, and a small lead there did not survive GPTQ and QAT (the tests'
# tiny Llama: 0.0197 vs 0.0203, then int4_qat +0.86% smoothed vs +0.77% not, in every format);
# SmolLM2-135M's leads (int4 0.42 vs 0.49, int8 0.015 vs 0.023) did (int4 .tflite +9.78% ->
# +8.21%, ONNX +7.90% -> +7.69%; int8 .tflite +2.00% -> +1.11%).
KEEP_BELOW = 0.9


@dataclass
class Site:
    """`consumers` read an input that `producer` writes channel by channel: a norm's 1-D
    weight (kind "norm") or a matrix's rows (kind "rows", checked on `parent`'s output)."""

    consumers: list[torch.nn.Module]
    producer: torch.nn.Module
    kind: str
    probe: torch.Tensor                 # the input of the module whose output is checked
    parent: torch.nn.Module | None = None
    absmax: torch.Tensor | None = None  # per input channel, over the calibration windows
    saved: list[tuple[torch.nn.Parameter, torch.Tensor]] = field(default_factory=list)


def rounds_inputs(formats: tuple[str, ...]) -> bool:
    from compressor.backends.llm.candidates import input_rounding

    return any(input_rounding(fmt) is not None for fmt in formats)


def choose_smoothing(loaded: Any, plan: Any, calibration: np.ndarray | None,
                     formats: tuple[str, ...], info: Any = None) -> dict[str, Any] | None:
    """Smooth `loaded.model` where it measures closer (statistics from the calibration windows
    the integers are made from, scores on the held-out ones, as candidates.py splits them); the
    record report.json keeps as a `candidates` entry, or None when no format rounds its inputs,
    there is no calibration text, the model is not one loaded here from a checkpoint of float
    weights (LoadedLm.owned, no file_grids) or it has no site to smooth."""
    from compressor.backends.llm.candidates import KlScorer, scores_by_format, split
    from compressor.backends.llm.quantize import quantized_weight_names

    windows, scoring = split(calibration)
    if not rounds_inputs(formats) or scoring is None or not loaded.owned or loaded.file_grids:
        return None   # a caller's model is never changed; a file's own integers stay as they are
    sites = find_sites(loaded.model, quantized_weight_names(loaded.model), windows)
    if not sites:
        return None
    channel_maxima(loaded.model, sites, windows[:STATS_WINDOWS])
    scorer = KlScorer(loaded.model, scoring)
    probe = _logits(loaded.model, windows)
    tried = [{"name": "none", "by_format": scores_by_format(scorer, _rtn(loaded, plan), formats),
              "settings": {"alpha": None, "sites": 0}}]
    for alpha in ALPHAS:
        folded = [site for site in sites if fold(site, scales(site, alpha))]
        if _close(_logits(loaded.model, windows), probe):
            tried.append({"name": f"smooth_{alpha:g}", "settings": {"alpha": alpha,
                                                                   "sites": len(folded)},
                          "by_format": scores_by_format(scorer, _rtn(loaded, plan), formats)})
        for site in reversed(folded):   # a matrix two sites scale (up: columns, rows)
            unfold(site)
    for entry in tried:
        entry["score"] = max(entry["by_format"].values())
    best = min(tried, key=lambda entry: entry["score"])
    if best["score"] > KEEP_BELOW * tried[0]["score"]:
        best = tried[0]
    if best["settings"]["alpha"] is not None:
        for site in sites:
            fold(site, scales(site, best["settings"]["alpha"]))
            site.saved.clear()          # kept: the originals are not needed again
    if info is not None:
        info("quantize: smoothing for inputs rounded at run time (mean KL, round to nearest): "
             + ", ".join(f"{e['name']} {e['score']:.4g}" for e in tried) + f"; kept {best['name']}")
    return {"artifact": "all", "step": "smooth", "winner": best["name"], "tried": tried,
            "rule": f"smoothed only when its score is below {KEEP_BELOW:g}x the unsmoothed one",
            "scored_on": f"{len(scorer.batches)} batches of held-out calibration windows, each "
                         "candidate's matrices rounded to nearest on the recipe's grid: mean "
                         "KL(float || candidate) per token as each format computes it"}


def find_sites(model: Any, names: list[str], windows: np.ndarray) -> list[Site]:
    """The smoothing sites of the matrices `names`, found by one forward of PROBE_TOKENS
    tokens: who wrote each matrix's input."""
    consumers = [m for m in matrix_modules(model, names)   # [out, in]: columns are inputs
                 if isinstance(m, torch.nn.Linear) and _own_weight(model, m)]
    written: dict[int, tuple[torch.nn.Module, torch.Tensor, torch.Tensor]] = {}
    read: dict[torch.nn.Module, torch.Tensor] = {}
    entered: dict[torch.nn.Module, torch.Tensor] = {}
    names_of = {module: name for name, module in model.named_modules()}
    parents = {m: _parent(model, names_of[m]) for m in consumers}

    def wrote(module: Any, args: tuple, out: Any) -> None:
        if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            written.setdefault(id(out), (module, args[0], out))

    def reads(module: Any, args: tuple) -> None:
        read.setdefault(module, args[0])

    def enters(module: Any, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor):
            entered.setdefault(module, args[0])

    hooks = [m.register_forward_hook(wrote) for m in model.modules()]
    hooks += [m.register_forward_pre_hook(reads) for m in consumers]
    hooks += [p.register_forward_pre_hook(enters) for p in set(parents.values()) if p is not None]
    try:
        _logits(model, windows)
    finally:
        for hook in hooks:
            hook.remove()
    by_producer: dict[torch.nn.Module, Site] = {}
    for consumer in consumers:
        found = written.get(id(read.get(consumer)))
        if found is not None and found[2] is read[consumer]:
            producer, given, _ = found
            if _is_channel_scale(producer, consumer):
                by_producer.setdefault(producer, Site([], producer, "norm", given)
                                       ).consumers.append(consumer)
            continue
        parent = parents[consumer]
        for sibling in _rows_writers(parent, consumer, consumers):
            site = Site([consumer], sibling, "rows", entered.get(parent), parent)
            if sibling not in by_producer and site.probe is not None and _foldable(site):
                by_producer[sibling] = site
                break
    return [site for site in by_producer.values() if site.kind == "rows" or _foldable(site)]


def _foldable(site: Site) -> bool:
    """Whether folding leaves the function unchanged (tried with uneven scales, undone)."""
    width = site.consumers[0].weight.shape[1]
    trial = torch.linspace(0.5, 2.0, width)
    valid = fold(site, trial)
    unfold(site)
    return valid


def channel_maxima(model: Any, sites: list[Site], windows: np.ndarray) -> None:
    """Each site's max |input| per channel over `windows`."""
    def seen(site: Site):
        def hook(module: Any, args: tuple) -> None:
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0).float()
            site.absmax = x if site.absmax is None else torch.maximum(site.absmax, x)
        return hook

    hooks = [site.consumers[0].register_forward_pre_hook(seen(site)) for site in sites]
    try:
        with torch.no_grad():
            for start in range(0, len(windows), CALIBRATION_BATCH):
                model(input_ids=torch.as_tensor(windows[start:start + CALIBRATION_BATCH]),
                      use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()


def fold(site: Site, s: torch.Tensor) -> bool:
    """Divide the site's channels by `s` and multiply its matrices' columns by `s`, if the
    check holds (else the site is left as it was). True when folded."""
    with torch.no_grad():
        before = _checked(site)
        for consumer in site.consumers:
            _replace(site, consumer.weight, consumer.weight.float() * s[None, :])
        _replace(site, site.producer.weight, _divided(site, site.producer.weight, s))
        if getattr(site.producer, "bias", None) is not None:
            _replace(site, site.producer.bias, site.producer.bias.float() / s)
        expected = before / s if site.kind == "norm" else before
        try:
            after = _checked(site)
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError):
            after = None     # the module needs more than its first input (attention)
    if after is not None and _close(after, expected):
        return True
    unfold(site)
    return False


def unfold(site: Site) -> None:
    for param, original in site.saved:
        param.data = original
    site.saved.clear()


def scales(site: Site, alpha: float) -> torch.Tensor:
    """The SmoothQuant rule per channel: max|x|**alpha / max|w|**(1 - alpha)."""
    columns = torch.stack([c.weight.detach().float().abs().amax(dim=0) for c in site.consumers])
    w = columns.amax(dim=0).clamp(min=1e-5)
    x = site.absmax.clamp(min=1e-5)
    return (x ** alpha / w ** (1 - alpha)).clamp(*S_RANGE)


def _divided(site: Site, weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return weight.float() / (s if site.kind == "norm" else s[:, None])


def _replace(site: Site, param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """A new tensor for `param` (a memory-mapped checkpoint's pages are never written)."""
    site.saved.append((param, param.data))
    param.data = value.to(param.dtype).contiguous()


def _logits(model: Any, windows: np.ndarray) -> torch.Tensor:
    """The model's logits on the probe window."""
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(windows[:1, :PROBE_TOKENS]),
                     use_cache=False).logits.float()


def _close(after: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether the folds left the whole model's function as it was: each site's check sees
    its own module only (a norm's output read by something besides the matrices would
    escape it)."""
    return float((after - before).abs().max()) <= FOLD_TOLERANCE * (float(before.abs().max()) or 1.0)


def _checked(site: Site) -> torch.Tensor:
    module = site.producer if site.kind == "norm" else site.parent
    out = module(site.probe)
    return (out[0] if isinstance(out, tuple) else out).float()


def _rtn(loaded: Any, plan: Any) -> dict:
    """Every matrix rounded to nearest on the plan's grid (the cheap stand-in each smoothing
    candidate is scored with)."""
    from compressor.backends.llm.quantize import quantize_candidates

    made = quantize_candidates(loaded, replace(plan, algorithm="rtn"), None, ("rtn",))
    return made["rtn"].weights


def _own_weight(model: Any, module: torch.nn.Module) -> bool:
    """Whether no other module computes with this module's weight (a tied head's table is the
    embedding's too: its columns cannot be scaled)."""
    weight = module.weight
    return sum(getattr(m, "weight", None) is weight for m in model.modules()) == 1


def _parent(model: Any, name: str) -> torch.nn.Module | None:
    path = name.rpartition(".")[0]
    return model.get_submodule(path) if path else None


def _is_channel_scale(producer: torch.nn.Module, consumer: torch.nn.Module) -> bool:
    weight = getattr(producer, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 1 \
        and weight.shape[0] == consumer.weight.shape[1]


def _rows_writers(parent: torch.nn.Module | None, consumer: torch.nn.Module,
                  matrices: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The parent's other matrices with as many rows as the consumer has inputs (a gated MLP:
    gate and up; the fold's check keeps the one it is valid for)."""
    if parent is None:
        return []
    width = consumer.weight.shape[1]
    return [m for m in parent.children()
            if m is not consumer and m in matrices and m.weight.shape[0] == width]
