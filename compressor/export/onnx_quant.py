"""int8 ONNX from a float32 ONNX file with onnxruntime's own quantization tools, for every
backend: the file a user gets is the one onnxruntime runs fastest.

- `quantize_onnx_static`: calibrated QDQ, per-channel 7-bit int8 weights (REDUCE_RANGE) and
  uint8 activations, after `quant_pre_process` (shape inference; BatchNorm folded into its
  conv, constants folded) and with in-model input preprocessing folded into the first convs
  (onnx_input_fold.py, where the first calibration batch shows a narrow band:
  input_band.py; int8 then quantizes the raw input, not the band).
  onnxruntime fuses each DequantizeLinear -> op -> QuantizeLinear group into an int8 kernel
  (QLinearConv, QLinearMatMul, QLinearAdd, ...), so Q/DQ sit only where it fuses them.
  Measured (64x64 resnet18, 1 thread): 0.59 ms vs 2.98 ms float.
- `quantize_onnx_dynamic`: int8 weights, activations quantized per batch at run time
  (MatMulInteger / ConvInteger): the transformer / RNN route. Constants are folded first, so
  weights a converter stores behind Transpose / Reshape are initializers ORT can quantize; with
  calibration batches, its settings are chosen per model by measurement (onnx_candidates.py).
- `quantize_onnx_weight_only`: see onnx_weight_only.py.

`exclude_nodes` are node names of the float32 file kept in float (quantize fallback, mixed
precision); they follow the nodes through pre-processing's fusions (onnx_prepare.py).
Integer inputs (token ids) are fed as they are and never quantized: onnxruntime quantizes
float tensors only.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from compressor.errors import DataError
from compressor.export.input_band import NARROW_INPUT
from compressor.export.onnx_input_fold import fold_input_affine_file
from compressor.export.onnx_prepare import prepared_names, preprocessed, quantizing
from compressor.export.onnx_ranges import LearnedRanges, range_overrides

# Symmetric int8 weights (zero point 0, so pruned zeros stay exact zeros) are ORT's default
# for QInt8; stated here because sparsity depends on it.
STATIC_OPTIONS = {"WeightSymmetric": True, "ActivationSymmetric": False}
# 7-bit weights: without VNNI (AVX2), onnxruntime's u8 x s8 kernels add pairs of products in
# 16 bits (vpmaddubsw), which saturates with full-range 8-bit weights; 7 bits cannot.
# Measured (zoo ResNet-18-style, random init, agreement with fp32 over 256 images): 0.910 ->
# 0.973 at the same latency; u8 x u8 (no saturation either) 0.984 but 1.37x slower.
# Depthwise convs run in onnxruntime's own kernel, exact with 8-bit weights on AVX2 too (random
# inputs 200-255, weights +-127: off by the output rounding only; dense convs by 52 steps), but
# 8-bit depthwise weights gained nothing consistent (logit error -7% on a MobileNetV3Small,
# +3% on an EfficientNetV2B0; agreement -0.6 / -5 pt on the same nets fed [0, 1] images), so
# every kernel keeps 7 bits.
REDUCE_RANGE = True


def quantize_onnx_static(fp32_path: Path, out_path: Path,
                         calibration: Sequence[dict[str, np.ndarray]],
                         exclude_nodes: Sequence[str] = (),
                         learned: LearnedRanges | None = None) -> None:
    """Calibrated QDQ int8 of `fp32_path` written to `out_path`. `calibration`: batches, each
    a dict ONNX input name -> array (all inputs of the model); `learned`: activation ranges a
    QAT model learned, used where they match a tensor instead of calibrated ones
    (onnx_ranges.py)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if not calibration:
        raise DataError("int8 calibration needs at least one batch of inputs; pass "
                        "training data (x_train): calibration runs the model on it")
    # With float nodes, ReLU / Clip stay explicit: by default the quantizer deletes them and
    # lets the next QuantizeLinear's clamp do their work, and keep_float_kernels (onnx_mixed)
    # feeds a float kernel the tensor from before that QuantizeLinear: pre-activation values.
    # onnxruntime fuses the kept activations into the int8 kernels again (Relu/Clip+Q fusion).
    # Learned ranges need them too: a QAT range may reach below zero at a ReLU's output
    # (tfmot's moving averages start at [-6, 6]), and then the clamp alone would not zero it.
    keep_activations = bool(exclude_nodes) or learned is not None
    options = {**STATIC_OPTIONS, "QDQKeepRemovableActivations": keep_activations}
    with tempfile.TemporaryDirectory(prefix="onnx-quant-", dir=Path(out_path).parent) as tmp:
        prepared = preprocessed(Path(fp32_path), Path(tmp) / "prepared.onnx")
        reader = CalibrationFeeds(prepared, calibration)
        fold_input_affine_file(prepared, reader.get_next() or {}, NARROW_INPUT)
        reader.rewind()
        if learned is not None:
            options["TensorQuantOverrides"] = range_overrides(prepared, learned)
        quantizing(lambda: quantize_static(
            str(prepared), str(out_path), reader, quant_format=QuantFormat.QDQ,
            per_channel=True, reduce_range=REDUCE_RANGE, activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=prepared_names(prepared, exclude_nodes),
            extra_options=options), "static")
        excluded = set(prepared_names(prepared, exclude_nodes))
    _tables_int8(Path(out_path), excluded)


def quantize_onnx_dynamic(fp32_path: Path, out_path: Path,
                          exclude_nodes: Sequence[str] = (),
                          calibration: Sequence[dict[str, np.ndarray]] = ()) -> dict:
    """Dynamic int8 (QInt8 weights) of `fp32_path` written to `out_path`; embedding tables as
    int8 rows (one scale each), gathered before they are scaled. With `calibration` batches,
    the settings (outlier smoothing, 7 or 8 bits, per channel or not) are chosen by measuring
    them (onnx_candidates.py); without, the defaults. Returns report.json's "candidates" entry."""
    from compressor.export.onnx_candidates import choose_dynamic, not_searched, write_dynamic

    with tempfile.TemporaryDirectory(prefix="onnx-quant-", dir=Path(out_path).parent) as tmp:
        prepared = preprocessed(Path(fp32_path), Path(tmp) / "prepared.onnx")
        excluded = set(prepared_names(prepared, exclude_nodes))
        if not calibration:
            name, settings = not_searched()
            write_dynamic(prepared, Path(out_path), excluded, settings)
            return {"artifact": "onnx", "scored_on": None, "tried": [], "winner": name,
                    "why": "no calibration data (no training split): the defaults, unsearched"}
        return choose_dynamic(prepared, Path(out_path), excluded,
                              list(CalibrationFeeds(prepared, calibration)), Path(tmp))


def _tables_int8(path: Path, excluded: set[str]) -> None:
    """The constant tables onnxruntime's quantizer left float (store_int8_tables), in place."""
    import onnx

    from compressor.export.onnx_weight_only import store_int8_tables

    proto = onnx.load(str(path))
    if store_int8_tables(proto, excluded):
        onnx.save(proto, str(path))


def quantize_onnx_weight_only(fp32_path: Path, out_path: Path,
                              exclude_nodes: Sequence[str] = ()) -> None:
    """int8 weights behind DequantizeLinear, float compute (see onnx_weight_only.py)."""
    from compressor.export.onnx_weight_only import weight_only_int8

    weight_only_int8(Path(fp32_path), Path(out_path), exclude_nodes)


class CalibrationFeeds:
    """onnxruntime's CalibrationDataReader over our batches, each cast to the dtype the model
    declares for that input (float data for a float input, int64 ids stay int64)."""

    def __init__(self, model_path: Path, batches: Sequence[dict[str, np.ndarray]]):
        import onnx

        graph = onnx.load(str(model_path), load_external_data=False).graph
        initializers = {init.name for init in graph.initializer}
        self.dtypes = {value.name: onnx.helper.tensor_dtype_to_np_dtype(
            value.type.tensor_type.elem_type) for value in graph.input
            if value.name not in initializers}
        for batch in batches:
            missing = sorted(set(self.dtypes) - set(batch))
            if missing:
                raise DataError(f"calibration batch lacks ONNX input(s) {', '.join(missing)}; "
                                f"the model's inputs are {', '.join(self.dtypes)}")
        self._batches = list(batches)
        self._iterator: Iterator[dict[str, np.ndarray]] = iter(())
        self.rewind()

    def rewind(self) -> None:
        self._iterator = iter([{name: np.ascontiguousarray(batch[name], dtype=dtype)
                                for name, dtype in self.dtypes.items()}
                               for batch in self._batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iterator, None)

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch

    def __len__(self) -> int:
        return len(self._batches)


def calibration_batches(inputs: dict[str, np.ndarray],
                        batch_size: int = 32) -> list[dict[str, np.ndarray]]:
    """Split whole arrays (one per ONNX input, same number of rows) into calibration batches."""
    rows = len(next(iter(inputs.values())))
    return [{name: array[start:start + batch_size] for name, array in inputs.items()}
            for start in range(0, rows, batch_size)]
