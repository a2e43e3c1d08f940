"""Dynamic int8's quality knobs, chosen per model by measurement.

Each knob helps one model and hurts another: smoothing (onnx_smooth.py) and 7-bit weights
lifted a bench encoder with seeded outlier channels, and together cost a pretrained
all-MiniLM-L6-v2 0.005 of mean cosine (0.9928 -> 0.9882). So with calibration batches every
setting in CANDIDATES is quantized and run in onnxruntime on held-out batches, and the one
whose outputs are closest to the float32 graph's (mean cosine) is kept. onnxruntime's own
`quantize_dynamic` defaults are one of them, so the choice is never below it on those batches.
Every candidate stores its embedding tables and leftover weights as int8 alike, so they all
have the size of an int8 file. Without calibration data: DEFAULT without smoothing, no search.

Blockwise int8 (onnxruntime's MatMulNBits, 8-bit, activations quantized per block of K:
onnx_blockwise.py) competes too, for every weight MatMul and, when that costs over
LATENCY_BOUND x the plain dynamic file, mixed into the best dynamic setting on the matmuls
where it gains most per multiply (each scored alone). A candidate costing over LATENCY_BOUND
or larger than SIZE_BOUND x the plain dynamic file cannot win, so "int8" stays a fast file:
all-MiniLM-L6-v2 blockwise reaches 0.9991 but runs 2.1-2.8x the plain dynamic file's time on
an AVX-512 VNNI CPU. Its cost is modelled from the graph (onnx_cost.py), never timed, so the
same model and seed give the same file: every candidate is still timed (batch 1, one
thread) and its p50 recorded, but timings decide nothing.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import first_line
from compressor.export.onnx_blockwise import write_blockwise
from compressor.export.onnx_fidelity import mean_cosine, run_outputs

# onnxruntime's dynamic quantizer's ops but Gather: it would store a table as uint8 with one
# scale (write_dynamic stores tables as int8 rows instead).
DYNAMIC_OPS = ("Conv", "MatMul", "Gemm", "Attention", "LSTM", "EmbedLayerNormalization")
HELD_OUT_FRACTION = 4     # 1 in 4 calibration batches scores, the rest calibrate smoothing
TIE = 1e-6                # a score this close to the best: the earlier (listed) candidate wins


@dataclass(frozen=True)
class DynamicSettings:
    smooth: bool          # activation outliers moved into the weights (onnx_smooth.py)
    # 7-bit weights: run-time uint8 activations of a Relu / GELU output fill 0..255, and AVX2's
    # u8 x s8 pair sums (vpmaddubsw, no VNNI) saturate in 16 bits with full-range weights; 7
    # bits cannot (a random feed-forward block, AVX2: mean cosine 0.990 -> 0.9998). With VNNI
    # or Arm dot products nothing saturates and the 7th bit is only lost precision.
    reduce_range: bool
    per_channel: bool     # one weight scale per output column, else one per matrix


DEFAULT = DynamicSettings(smooth=True, reduce_range=True, per_channel=True)
PLAIN = DynamicSettings(smooth=False, reduce_range=False, per_channel=False)
# Few on purpose: each costs a quantization and a run. Listed in order of preference on ties.
CANDIDATES = {
    "smooth_7bit_per_channel": DEFAULT,
    "7bit_per_channel": DynamicSettings(smooth=False, reduce_range=True, per_channel=True),
    "smooth_8bit_per_channel": DynamicSettings(smooth=True, reduce_range=False, per_channel=True),
    "8bit_per_channel": DynamicSettings(smooth=False, reduce_range=False, per_channel=True),
    "smooth_8bit_per_tensor": DynamicSettings(smooth=True, reduce_range=False, per_channel=False),
    "onnxruntime_defaults": PLAIN,
}
PLAIN_NAME = "onnxruntime_defaults"
BLOCKWISE = "blockwise_int8"   # every weight MatMul as MatMulNBits (onnx_blockwise.py)
LATENCY_BOUND = 1.25   # modelled cost / the plain file's (onnx_cost.py): costlier cannot win
SIZE_BOUND = 1.05      # bytes / the plain dynamic file's: larger candidates cannot win
MIXED_BUDGET = 1.2     # the mixed candidate's modelled cost / the plain dynamic file's
MAX_RANKED = 96        # weight MatMuls the mixed candidate ranks at most (a quantization each)
# onnxruntime's quantizers raise these on graphs they cannot handle (onnx_prepare.quantizing)
QUANTIZER_ERRORS = (RuntimeError, ValueError, KeyError, TypeError, AssertionError, IndexError)


def not_searched() -> tuple[str, DynamicSettings]:
    """The setting without calibration data: DEFAULT but smoothing, which measures activations."""
    return "7bit_per_channel", CANDIDATES["7bit_per_channel"]


def write_dynamic(prepared: Path, out_path: Path, excluded: Collection[str],
                  settings: DynamicSettings) -> None:
    """onnxruntime's dynamic int8 of `prepared` (already smoothed when `settings.smooth`), then
    the weights it leaves float as int8 (embedding tables; tf2onnx's LSTM / GRU; kernels shape
    arithmetic also reads; folded position tables), so no "int8" file keeps float matrices."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from compressor.export.onnx_prepare import quantizing
    from compressor.export.onnx_weight_only import (WEIGHT_OPS, store_int8_tables,
                                                    store_int8_weights)

    quantizing(lambda: quantize_dynamic(
        str(prepared), str(out_path), op_types_to_quantize=list(DYNAMIC_OPS),
        per_channel=settings.per_channel, reduce_range=settings.reduce_range,
        weight_type=QuantType.QInt8, nodes_to_exclude=sorted(excluded),
        extra_options={"MatMulConstBOnly": True}), "dynamic")
    proto = onnx.load(str(out_path))
    if store_int8_weights(proto, set(excluded), WEIGHT_OPS) + store_int8_tables(proto, set(excluded)):
        onnx.save(proto, str(out_path))


def split(batches: Sequence[Any]) -> tuple[list[Any], list[Any], bool]:
    """(calibrate, score, held_out): every HELD_OUT_FRACTION-th batch scores when there are
    two or more; one batch does both."""
    if len(batches) < 2:
        return list(batches), list(batches), False
    score = list(batches[HELD_OUT_FRACTION - 1::HELD_OUT_FRACTION]) or [batches[-1]]
    calibrate = [b for b in batches if not any(b is s for s in score)]
    return calibrate, score, True


def choose_dynamic(prepared: Path, out_path: Path, excluded: Collection[str],
                   feeds: Sequence[dict[str, np.ndarray]], workdir: Path) -> dict[str, Any]:
    """The best candidate written to `out_path`; returns what was tried (report.json's
    "candidates" entry). `feeds`: calibration batches in the model's input dtypes.

    Candidates: CANDIDATES (dynamic int8); blockwise int8 (MatMulNBits, onnx_blockwise.py) for
    every weight MatMul; and, when that costs over LATENCY_BOUND, dynamic int8 with blockwise
    int8 for the matmuls where it gains most per multiply (`mixed`). Each is scored (mean
    cosine vs float32 on held-out batches), sized and costed (onnx_cost.py: from the graph);
    the closest to float wins among those at most LATENCY_BOUND x the plain dynamic file's
    modelled cost and SIZE_BOUND x its bytes. Each is timed too (batch 1, one thread,
    round-robin with the plain dynamic file), for the report only."""
    import shutil

    from compressor.export import onnx_cost
    from compressor.export.onnx_smooth import smoothed

    calibrate, score, held_out = split(feeds)
    search = Search(prepared, excluded, workdir, score)
    smoothed_file = smoothed(prepared, calibrate, excluded, workdir / "smoothed.onnx")
    for name, settings in CANDIDATES.items():
        if settings.smooth and smoothed_file == prepared:
            continue   # no activation had outliers: the same file as its unsmoothed twin
        path = workdir / f"candidate-{name}.onnx"
        write_dynamic(smoothed_file if settings.smooth else prepared, path, excluded, settings)
        search.add(name, path, asdict(settings))
    notes = search.blockwise(smoothed_file)
    for entry in search.tried:
        entry["eligible"] = eligible(entry, search.tried)
    winner = pick(search.tried)
    shutil.copyfile(search.files[winner], out_path)
    rows = sum(len(next(iter(batch.values()))) for batch in score)
    where = "held-out calibration batches" if held_out else \
        "calibration batches (too few to hold any out: the same ones smoothing measured)"
    return {"artifact": "onnx", "scored_on": f"{len(score)} {where} ({rows} rows), mean "
            "cosine vs float32 in onnxruntime", "timed_on": "batch 1, onnxruntime CPU, 1 "
            "thread, round-robin with the plain dynamic file (p50_vs_plain; recorded, not "
            "used by the rule)", "cost_model": onnx_cost.describe(),
            "rule": f"closest to float among candidates at most {LATENCY_BOUND}x the plain "
            f"dynamic file's modelled cost (cost_vs_plain) and {SIZE_BOUND}x its bytes",
            "tried": search.tried, "winner": winner, **notes}


class Search:
    """The candidates tried so far ({name, settings, bytes, score, cost_vs_plain, p50_ms,
    p50_vs_plain}), their files and matmul costs; scores against the float graph on the
    held-out batches."""

    def __init__(self, prepared: Path, excluded: Collection[str], workdir: Path,
                 score: Sequence[dict[str, np.ndarray]]) -> None:
        self.prepared, self.excluded, self.workdir = prepared, set(excluded), workdir
        self.score_batches = list(score)
        self.reference = run_outputs(prepared, self.score_batches)
        self.feed = {name: array[:1] for name, array in self.score_batches[0].items()}
        self.tried: list[dict[str, Any]] = []
        self.files: dict[str, Path] = {}
        self.costs: dict[str, float] = {}   # onnx_cost.matmul_cost of each file

    def score(self, path: Path) -> float:
        return round(mean_cosine(run_outputs(path, self.score_batches), self.reference), 6)

    def add(self, name: str, path: Path, settings: dict[str, Any]) -> dict[str, Any]:
        """The candidate's entry, its cost_vs_plain too once the plain file is in (then the
        earlier entries get theirs)."""
        from compressor.export import onnx_cost

        self.files[name] = path
        self.costs[name] = onnx_cost.matmul_cost(path)
        self.tried.append({"name": name, "settings": settings, "bytes": path.stat().st_size,
                           "score": self.score(path)})
        if PLAIN_NAME in self.costs:
            for entry in self.tried:
                entry.setdefault("cost_vs_plain", onnx_cost.vs_plain(
                    self.costs[entry["name"]], self.costs[PLAIN_NAME]))
        return self.tried[-1]

    def time(self, names: Sequence[str]) -> None:
        """p50_ms and p50_vs_plain of `names`, timed round-robin with the plain file."""
        from compressor.export.onnx_blockwise import p50_ms

        order = [PLAIN_NAME, *[name for name in names if name != PLAIN_NAME]]
        timed = dict(zip(order, p50_ms([self.files[name] for name in order], self.feed)))
        for entry in self.tried:
            if entry["name"] in names:
                entry["p50_ms"] = timed[entry["name"]]
                entry["p50_vs_plain"] = round(timed[entry["name"]] / timed[PLAIN_NAME], 3)

    def blockwise(self, smoothed_file: Path) -> dict[str, Any]:
        """Adds the blockwise candidates, then times every candidate (for the report); returns
        notes for report.json (why a candidate was not built; the mixed candidate's ranking)."""
        notes = self.add_blockwise(smoothed_file)
        self.time([entry["name"] for entry in self.tried])
        return notes

    def add_blockwise(self, smoothed_file: Path) -> dict[str, Any]:
        """The blockwise candidate, and the mixed one when that costs over LATENCY_BOUND."""
        import onnx

        from compressor.export import onnx_blockwise

        matmuls = onnx_blockwise.constant_matmuls(self.prepared, self.excluded)
        why = onnx_blockwise.available() or (None if matmuls else
                                             "no MatMul with constant weights")
        block = onnx_blockwise.block_size(matmuls.values()) if matmuls else 0
        if why is None:
            path = self.workdir / f"candidate-{BLOCKWISE}.onnx"
            try:
                write_blockwise(onnx.load(str(self.prepared)), path, set(matmuls),
                                self.excluded, block)
                self.add(BLOCKWISE, path, {"smooth": False, "blockwise": "all", "block": block,
                                           "bits": onnx_blockwise.BITS,
                                           "accuracy_level": onnx_blockwise.ACCURACY_LEVEL})
            except QUANTIZER_ERRORS as exc:   # the dynamic candidates stand without it
                why = f"onnxruntime's MatMulNBits quantizer or kernel failed: {first_line(exc)}"
        if why is not None:
            return {"blockwise": f"not tried: {why}"}
        if self.tried[-1]["cost_vs_plain"] <= LATENCY_BOUND:
            return {}   # fast enough whole: nothing left for a mix to win
        if len(matmuls) > MAX_RANKED:
            return {"mixed": f"not tried: {len(matmuls)} weight MatMuls to rank (at most "
                             f"{MAX_RANKED}: one quantization each)"}
        try:
            return self.mixed(matmuls, block, smoothed_file)
        except QUANTIZER_ERRORS as exc:
            return {"mixed": f"not tried: {first_line(exc)}"}

    def mixed(self, matmuls: dict[str, tuple[int, int]], block: int,
              smoothed_file: Path) -> dict[str, Any]:
        """The closest-to-float dynamic candidate with blockwise int8 on the matmuls where it
        gains most per cost: each matmul measured alone blockwise (its gain in score), its
        cost what MatMulNBits adds over MatMulInteger in the cost model (onnx_cost.py), as
        many as fit MIXED_BUDGET x the plain file's modelled cost; one file, a candidate."""
        import onnx

        from compressor.export import onnx_cost

        dynamic = [entry for entry in self.tried if entry["name"] in CANDIDATES]
        base_name = pick(dynamic)
        base = next(entry for entry in dynamic if entry["name"] == base_name)
        settings = CANDIDATES[base_name]
        source = smoothed_file if settings.smooth else self.prepared

        def build(nodes: Collection[str], path: Path) -> Path:
            write_dynamic(source, path, self.excluded | set(nodes), settings)
            write_blockwise(onnx.load(str(path)), path, nodes, self.excluded, block)
            return path

        gains = {node: round(self.score(build([node], self.workdir / "rank.onnx")) -
                             base["score"], 6) for node in matmuls}
        costs = onnx_cost.blockwise_costs(matmuls, self.costs[PLAIN_NAME])
        ranking = {"mixed_ranking": {"base": base_name, "gain_if_blockwise": gains,
                                     "cost_vs_plain": costs, "budget_vs_plain": MIXED_BUDGET}}
        chosen = fit(gains, costs, MIXED_BUDGET - base["cost_vs_plain"])
        if not chosen:
            return {**ranking, "mixed": "not tried: no matmul gains within the budget"}
        self.add(f"{base_name}+blockwise_{len(chosen)}of{len(matmuls)}",
                 build(chosen, self.workdir / "candidate-mixed.onnx"),
                 {**asdict(settings), "blockwise": sorted(chosen), "block": block, "bits": 8,
                  "accuracy_level": 4})
        return ranking


def fit(gains: dict[str, float], costs: dict[str, float], budget: float) -> list[str]:
    """The nodes with a positive gain, best gain per cost first (ties: listed order), while
    the sum of their costs (in units of the plain file's modelled cost) stays within budget."""
    chosen, spent = [], 0.0
    for node in sorted((n for n in gains if gains[n] > 0),
                       key=lambda n: -gains[n] / max(costs[n], 1e-9)):
        if spent + costs[node] <= budget:
            chosen.append(node)
            spent += costs[node]
    return chosen


def eligible(entry: dict[str, Any], tried: Sequence[dict[str, Any]]) -> bool:
    """At most LATENCY_BOUND x the plain dynamic file's modelled cost (cost_vs_plain, from the
    graph: never a timing) and SIZE_BOUND x its bytes; uncosted entries count as cheap enough."""
    plain = next(e for e in tried if e["name"] == PLAIN_NAME)
    return entry.get("cost_vs_plain", 1.0) <= LATENCY_BOUND and \
        entry["bytes"] <= SIZE_BOUND * plain["bytes"]


def pick(tried: Sequence[dict[str, Any]]) -> str:
    """The name of the highest score among the eligible entries (all when none is marked);
    within TIE of it, the earliest listed."""
    pool = [e for e in tried if e.get("eligible", True)] or list(tried)
    best = max(entry["score"] for entry in pool)
    return next(entry["name"] for entry in pool if entry["score"] >= best - TIE)
