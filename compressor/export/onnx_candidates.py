"""Dynamic int8's quality knobs, chosen per model by measurement.

Each knob helps one model and hurts another: smoothing (onnx_smooth.py) and 7-bit weights
lifted a bench encoder with seeded outlier channels, and together cost a pretrained
all-MiniLM-L6-v2 0.005 of mean cosine (0.9928 -> 0.9882). So with calibration batches every
setting in CANDIDATES is quantized and run in onnxruntime on held-out batches, and the one
whose outputs are closest to the float32 graph's (mean cosine) is kept. onnxruntime's own
`quantize_dynamic` defaults are one of them, so the choice is never below it on those batches.
Every candidate stores its embedding tables and leftover weights as int8 alike, so they all
have the size of an int8 file. Without calibration data: DEFAULT without smoothing, no search.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
    """The best of CANDIDATES written to `out_path`; returns what was tried (report.json's
    "candidates" entry). `feeds`: calibration batches in the model's input dtypes."""
    import shutil

    from compressor.export.onnx_smooth import smoothed

    calibrate, score, held_out = split(feeds)
    reference = run_outputs(prepared, score)
    smoothed_file = smoothed(prepared, calibrate, excluded, workdir / "smoothed.onnx")
    tried, files = [], {}
    for name, settings in CANDIDATES.items():
        if settings.smooth and smoothed_file == prepared:
            continue   # no activation had outliers: the same file as its unsmoothed twin
        files[name] = workdir / f"candidate-{name}.onnx"
        write_dynamic(smoothed_file if settings.smooth else prepared, files[name], excluded,
                      settings)
        tried.append({"name": name, "settings": asdict(settings),
                      "score": round(mean_cosine(run_outputs(files[name], score), reference), 6)})
    best = max(entry["score"] for entry in tried)
    winner = next(entry["name"] for entry in tried if entry["score"] >= best - TIE)
    shutil.copyfile(files[winner], out_path)
    rows = sum(len(next(iter(batch.values()))) for batch in score)
    where = "held-out calibration batches" if held_out else \
        "calibration batches (too few to hold any out: the same ones smoothing measured)"
    return {"artifact": "onnx", "scored_on": f"{len(score)} {where} ({rows} rows), mean "
            "cosine vs float32 in onnxruntime", "tried": tried, "winner": winner}


def run_outputs(path: Path, batches: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of `path` on each batch, in onnxruntime."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    return [session.run(None, {name: batch[name] for name in names}) for batch in batches]


def mean_cosine(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> float:
    """Per-row cosine (each row flattened) of every float output, averaged over rows, then
    over outputs."""
    per_output: dict[int, list[np.ndarray]] = {}
    for got_batch, want_batch in zip(got, want):
        for index, (a, b) in enumerate(zip(got_batch, want_batch)):
            if not np.issubdtype(np.asarray(b).dtype, np.floating):
                continue
            a = np.asarray(a, np.float64).reshape(len(a), -1)
            b = np.asarray(b, np.float64).reshape(len(b), -1)
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            cos = np.where(norms > 0, np.sum(a * b, axis=1) / np.maximum(norms, 1e-30), 1.0)
            per_output.setdefault(index, []).append(cos)
    return float(np.mean([np.concatenate(rows).mean() for rows in per_output.values()]))
