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
onnx_blockwise.py) competes too, for every weight MatMul; and the mixed candidate
(onnx_mix.py): the best dynamic setting with some inputs rounded per token
(onnx_per_token.py) and, when blockwise whole costs over LATENCY_BOUND x the plain dynamic
file, some matmuls blockwise, where each gains most per cost (each scored alone). A candidate
costing over LATENCY_BOUND or larger than SIZE_BOUND x the plain dynamic file cannot win, so
"int8" stays a fast file: all-MiniLM-L6-v2 blockwise reaches 0.9991 but runs 2.1-2.8x the
plain dynamic file's time on an AVX-512 VNNI CPU. Its cost is modelled from the graph
(onnx_cost.py), never timed, so the same model and seed give the same file: every candidate
is still timed (batch 1, one thread) and its p50 recorded, but timings decide nothing.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from compressor.errors import first_line
from compressor.export import onnx_mix
from compressor.export.onnx_blockwise import write_blockwise
from compressor.export.onnx_dynamic import DynamicSettings, write_dynamic
from compressor.export.onnx_fidelity import mean_cosine, run_outputs

HELD_OUT_FRACTION = 4     # 1 in 4 calibration batches scores, the rest calibrate smoothing
TIE = 1e-6                # a score this close to the best ties it: the smaller file wins
DEFAULT = DynamicSettings(smooth=True, reduce_range=True, per_channel=True)
PLAIN = DynamicSettings(smooth=False, reduce_range=False, per_channel=False)
# Few on purpose: each costs a quantization and a run. Listed in order of preference on ties
# of score and bytes.
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
SIZE_BOUND = 1.05      # bytes / the plain dynamic file's (+ SIZE_SLACK): larger cannot win
SIZE_SLACK = 1024      # bytes: a few side vectors are 5% of a toy graph's file
# onnxruntime's quantizers raise these on graphs they cannot handle (onnx_prepare.quantizing)
QUANTIZER_ERRORS = (RuntimeError, ValueError, KeyError, TypeError, AssertionError, IndexError)


def not_searched() -> tuple[str, DynamicSettings]:
    """The setting without calibration data: DEFAULT but smoothing, which measures activations."""
    return "7bit_per_channel", CANDIDATES["7bit_per_channel"]


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
        """The blockwise candidate, then the mixed one (onnx_mix.py: per-token inputs, and
        blockwise matmuls when blockwise whole costs over LATENCY_BOUND)."""
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
        notes = {"blockwise": f"not tried: {why}"} if why else {}
        rankable = {} if why or self.tried[-1]["cost_vs_plain"] <= LATENCY_BOUND else matmuls
        if len(rankable) > onnx_mix.MAX_RANKED:
            notes["mixed_blockwise"] = (f"not ranked: {len(rankable)} weight MatMuls (at most "
                                        f"{onnx_mix.MAX_RANKED}: one quantization each)")
            rankable = {}
        try:
            return {**notes, **self.mixed(rankable, len(matmuls), block, smoothed_file)}
        except QUANTIZER_ERRORS as exc:
            return {**notes, "mixed": f"not tried: {first_line(exc)}"}

    def mixed(self, matmuls: dict[str, tuple[int, int]], total_matmuls: int, block: int,
              smoothed_file: Path) -> dict[str, Any]:
        """The closest-to-float dynamic candidate made finer where it gains most per cost
        (onnx_mix.py), added when any place gains; returns the ranking notes."""
        dynamic = [entry for entry in self.tried if entry["name"] in CANDIDATES]
        name = pick(dynamic)
        entry = next(entry for entry in dynamic if entry["name"] == name)
        settings = CANDIDATES[name]
        base = onnx_mix.Base(name, settings, smoothed_file if settings.smooth else self.prepared,
                             self.files[name], entry["score"], entry["cost_vs_plain"])
        notes, candidate = onnx_mix.mixed(base, matmuls, total_matmuls, block, self.excluded,
                                          self.score, self.costs[PLAIN_NAME], self.workdir)
        if candidate is not None:
            self.add(*candidate)
        return notes


def eligible(entry: dict[str, Any], tried: Sequence[dict[str, Any]]) -> bool:
    """At most LATENCY_BOUND x the plain dynamic file's modelled cost (cost_vs_plain, from the
    graph: never a timing) and SIZE_BOUND x its bytes + SIZE_SLACK; uncosted entries count as
    cheap enough."""
    plain = next(e for e in tried if e["name"] == PLAIN_NAME)
    return entry.get("cost_vs_plain", 1.0) <= LATENCY_BOUND and \
        entry["bytes"] <= SIZE_BOUND * plain["bytes"] + SIZE_SLACK


def pick(tried: Sequence[dict[str, Any]]) -> str:
    """The name of the highest score among the eligible entries (all when none is marked);
    within TIE of it, the smallest file, then the earliest listed."""
    pool = [e for e in tried if e.get("eligible", True)] or list(tried)
    best = max(entry["score"] for entry in pool)
    tied = [entry for entry in pool if round(best - entry["score"], 9) <= TIE]
    return min(tied, key=lambda entry: entry.get("bytes", 0))["name"]
