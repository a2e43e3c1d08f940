"""The mixed dynamic int8 candidate (onnx_candidates.py): the best dynamic setting, made finer
only where that pays. Two kinds of place: an input rounded per token instead of per tensor
(onnx_per_token.py: a few elementwise ops at run time) and a weight MatMul as blockwise int8
MatMulNBits (onnx_blockwise.py: a slower kernel). Each place is tried alone on the base
setting and scored on the held-out batches (its gain in mean cosine), costed by the graph's
latency model (onnx_cost.py), and the best gains per cost are taken while the whole file's
modelled cost stays within MIXED_BUDGET x the plain dynamic file's: one file, one candidate.

all-MiniLM-L6-v2 (8-bit per channel, 0.9929): its first three feed-forward inputs per token
gain +0.0012, +0.0006, +0.0006 alone, and with its attention outputs' LayerNorms most of the
way to 0.9974 (all 24 inputs per token) at a few percent of the run time, where a blockwise
feed-forward matmul costs a seventh of the file's time for +0.0013.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compressor.export.onnx_dynamic import DynamicSettings, write_dynamic

MIXED_BUDGET = 1.2     # the mixed candidate's modelled cost / the plain dynamic file's
MAX_RANKED = 96        # weight MatMuls ranked blockwise at most (a quantization each)
# The least gain in held-out mean cosine a place must bring alone to be worth run time:
# bert6x384 (random init, 0.99992 per tensor) has places gaining 1e-6 to 4e-6 each, and a
# slower file for those is a slower file for nothing; all-MiniLM-L6-v2's gain 1e-4 to 1e-3.
MIN_GAIN = 1e-5


@dataclass(frozen=True)
class Base:
    """The dynamic candidate the mix starts from: its setting, the graph it quantizes (the
    smoothed one for a smoothing setting), its file, score and modelled cost."""
    name: str
    settings: DynamicSettings
    source: Path
    file: Path
    score: float
    cost_vs_plain: float


def mixed(base: Base, matmuls: dict[str, tuple[int, int]], total_matmuls: int, block: int,
          excluded: Collection[str], score: Callable[[Path], float], plain_cost: float,
          workdir: Path) -> tuple[dict[str, Any], tuple[str, Path, dict[str, Any]] | None]:
    """(report notes with the ranking, the candidate (name, file, settings) or None).
    `matmuls`: those that may go blockwise ({} when blockwise whole is cheap enough or cannot
    be built); every input `base.file` rounds per tensor may go per token."""
    import onnx

    from compressor.export import onnx_blockwise, onnx_cost, onnx_per_token

    rank = workdir / "rank.onnx"
    sites = onnx_per_token.sites(onnx.load(str(base.file)))
    budget = MIXED_BUDGET - base.cost_vs_plain
    token_costs = onnx_cost.per_token_costs(sites, plain_cost)
    matmul_costs = onnx_cost.blockwise_costs(matmuls, plain_cost)

    def gain(path: Path) -> float:
        return round(score(path) - base.score, 6)

    # only a place that fits the budget alone is measured (a tiny model's never do: its
    # per-token ops and blockwise matmuls each cost more than the whole budget)
    per_token = {tensor: gain(build(base, rank, excluded, (), [tensor], block))
                 for tensor in sites if token_costs[tensor] <= budget}
    blockwise = {node: gain(build(base, rank, excluded, [node], (), block))
                 for node in matmuls if matmul_costs[node] <= budget}
    costs = {**{("per_token", t): token_costs[t] for t in per_token},
             **{("blockwise", n): matmul_costs[n] for n in blockwise}}
    gains = {**{("per_token", t): g for t, g in per_token.items()},
             **{("blockwise", n): g for n, g in blockwise.items()}}
    notes = {"mixed_ranking": {
        "base": base.name, "gain_if_per_token": per_token,
        "per_token_cost_vs_plain": token_costs, "gain_if_blockwise": blockwise,
        "cost_vs_plain": matmul_costs, "budget_vs_plain": MIXED_BUDGET}}
    chosen = fit(gains, costs, budget)
    if not chosen:
        why = "no place gains within the budget" if gains else \
            "no place fits the budget alone (none measured)"
        return {**notes, "mixed": f"not tried: {why}"}, None
    tokens = sorted(name for kind, name in chosen if kind == "per_token")
    nodes = sorted(name for kind, name in chosen if kind == "blockwise")
    name = base.name + (f"+per_token_{len(tokens)}of{len(sites)}" if tokens else "") + \
        (f"+blockwise_{len(nodes)}of{total_matmuls}" if nodes else "")
    settings = {**asdict(base.settings), "per_token": tokens, "blockwise": nodes}
    if nodes:
        settings.update(block=block, bits=onnx_blockwise.BITS,
                        accuracy_level=onnx_blockwise.ACCURACY_LEVEL)
    return notes, (name, build(base, workdir / "candidate-mixed.onnx", excluded, nodes, tokens,
                               block), settings)


def build(base: Base, path: Path, excluded: Collection[str], blockwise_nodes: Collection[str],
          per_token_inputs: Collection[str], block: int) -> Path:
    """The base setting with `blockwise_nodes` as MatMulNBits and `per_token_inputs` rounded
    per token, written to `path`."""
    import onnx

    from compressor.export.onnx_blockwise import write_blockwise
    from compressor.export.onnx_per_token import round_per_token

    if blockwise_nodes:
        write_dynamic(base.source, path, set(excluded) | set(blockwise_nodes), base.settings)
    proto = onnx.load(str(path if blockwise_nodes else base.file))   # else the same quantization
    round_per_token(proto, set(per_token_inputs))
    if blockwise_nodes:
        write_blockwise(proto, path, blockwise_nodes, excluded, block)
    else:
        onnx.save(proto, str(path))
    return path


def fit(gains: dict[Hashable, float], costs: dict[Hashable, float], budget: float) -> list:
    """The places gaining MIN_GAIN or more, best gain per cost first (ties: listed order), while
    the sum of their costs (in units of the plain file's modelled cost) stays within budget."""
    chosen, spent = [], 0.0
    for place in sorted((p for p in gains if gains[p] >= MIN_GAIN),
                        key=lambda p: -gains[p] / max(costs[p], 1e-9)):
        if spent + costs[place] <= budget:
            chosen.append(place)
            spent += costs[place]
    return chosen
