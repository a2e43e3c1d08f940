"""Writing one dynamic int8 ONNX file: onnxruntime's quantize_dynamic with one setting of its
quality knobs (DynamicSettings), then every weight it leaves float stored as int8. Which
setting a model gets is measured (onnx_candidates.py)."""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# onnxruntime's dynamic quantizer's ops but Gather: it would store a table as uint8 with one
# scale (write_dynamic stores tables as int8 rows instead).
DYNAMIC_OPS = ("Conv", "MatMul", "Gemm", "Attention", "LSTM", "EmbedLayerNormalization")


@dataclass(frozen=True)
class DynamicSettings:
    smooth: bool          # activation outliers moved into the weights (onnx_smooth.py)
    # 7-bit weights: run-time uint8 activations of a Relu / GELU output fill 0..255, and AVX2's
    # u8 x s8 pair sums (vpmaddubsw, no VNNI) saturate in 16 bits with full-range weights; 7
    # bits cannot (a random feed-forward block, AVX2: mean cosine 0.990 -> 0.9998). With VNNI
    # or Arm dot products nothing saturates and the 7th bit is only lost precision.
    reduce_range: bool
    per_channel: bool     # one weight scale per output column, else one per matrix


def write_dynamic(prepared: Path, out_path: Path, excluded: Collection[str],
                  settings: DynamicSettings) -> None:
    """onnxruntime's dynamic int8 of `prepared` (already smoothed when `settings.smooth`), then
    the weights it leaves float as int8 (embedding tables; tf2onnx's LSTM / GRU; kernels shape
    arithmetic also reads; folded position tables), so no "int8" file keeps float matrices;
    the parameters beside them narrower (onnx_compact.narrow_side_params)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from compressor.export.onnx_compact import narrow_side_params
    from compressor.export.onnx_prepare import quantizing
    from compressor.export.onnx_weight_only import (WEIGHT_OPS, store_int8_tables,
                                                    store_int8_weights)

    quantizing(lambda: quantize_dynamic(
        str(prepared), str(out_path), op_types_to_quantize=list(DYNAMIC_OPS),
        per_channel=settings.per_channel, reduce_range=settings.reduce_range,
        weight_type=QuantType.QInt8, nodes_to_exclude=sorted(excluded),
        extra_options={"MatMulConstBOnly": True}), "dynamic")
    proto = onnx.load(str(out_path))
    store_int8_weights(proto, set(excluded), WEIGHT_OPS)
    store_int8_tables(proto, set(excluded))
    narrow_side_params(proto)
    onnx.save(proto, str(out_path))
