"""What tfmot's int8 quantization-aware training can wrap, and a copy it can wrap.

tfmot's default registry knows conv / dense / pooling / activation layers. keras.applications
nets hold more:
- hard-swish and hard-sigmoid written with scalar arithmetic (`ReLU6(x + 3.0) * (1 / 6)`,
  MobileNetV3): tf_keras stores `x + 3.0` as a TFOpLambda, which tfmot's layout transform
  rebuilds with its tensor inside a list (AttributeError in quantize_apply). A scalar
  `x + c`, `x - c`, `x * c`, `x / c` is the affine map `Rescaling(scale, offset)`, so the
  copy made for QAT has Rescaling layers there: the same computation, the same TFLite ops;
- input preprocessing (Rescaling, Normalization: EfficientNetV2), BatchNormalization not
  right after a conv (DenseNet's pre-activation BN), Multiply (hard-swish, squeeze-excite)
  and any other layer tfmot has no config for: their weights (if any) stay float and their
  output gets an int8 range, as tfmot does for a BatchNormalization it folds, so the next
  conv / dense op computes in int8;
- average pooling keeps its input's int8 range (TFLite's AVERAGE_POOL_2D requires it);
- a kernel tfmot has no config for (Conv1D, Conv3D, LSTM, GRU, MultiHeadAttention: it would
  stay float), a TF-op layer other than scalar arithmetic (tfmot cannot rebuild it) and a
  nested model cannot be wrapped: `qat_blockers` names them, before any step runs.
"""
from __future__ import annotations

from typing import Any

from compressor.backends.keras.env import import_tf_keras, import_tfmot
from compressor.backends.keras.qat_rewrite import layer_entries, quantizable_copy, scalar_affine

OP_LAYERS = ("TFOpLambda", "SlicingOpLambda")
FOLDING_LAYERS = ("Conv2D", "DepthwiseConv2D", "Dense")
TRANSFORMED = ("SeparableConv1D", "SeparableConv2D")   # tfmot splits them into supported convs
# TFLite's int8 AVERAGE_POOL_2D must keep its input's scale; tfmot gives the layer a range of
# its own, and the converter refused DenseNet's transition pools ("quantization parameters
# violate the same scale constraint"). Without it the pool takes its input's range.
SAME_SCALE = ("AveragePooling1D", "AveragePooling2D", "AveragePooling3D")
# Left float by QAT and stored int8 per row in the TFLite file (export/tflite_tables.py).
FLOAT_TABLES = ("Embedding",)


def with_fake_quant(model: Any, scheme: Any = None) -> Any:
    """quantize_apply of `model`'s quantizable copy, annotated as `annotated` says, in
    `scheme` (None: tfmot's default 8-bit scheme)."""
    quantize = import_tfmot().quantization.keras
    with quantize.quantize_scope():   # it holds the configs `annotated` uses
        annotated_model = annotated(quantizable_copy(model))
        if scheme is None:
            return quantize.quantize_apply(annotated_model)
        return quantize.quantize_apply(annotated_model, scheme)


def annotated(model: Any) -> Any:
    """`model` annotated for quantize_apply: tfmot's own layers (and the BatchNormalization
    layers its transform folds) with its configs, every other layer with an output-only one."""
    tf_keras = import_tf_keras()
    quantize = import_tfmot().quantization.keras
    registry = _registry()
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_configs as configs,
    )

    folded = _folded_batch_norms(model)

    def annotate(layer: Any) -> Any:
        if type(layer).__name__ in SAME_SCALE:
            return quantize.quantize_annotate_layer(layer, configs.NoOpQuantizeConfig())
        if registry.supports(layer) or layer.name in folded:
            return quantize.quantize_annotate_layer(layer)
        # Every other layer is annotated too (left unannotated, tfmot's prune-preserving
        # scheme looks up a config for it when it feeds an annotated layer, and fails): its
        # weights stay float and its output gets an int8 range, which the next conv / dense
        # op needs to compute in int8.
        return quantize.quantize_annotate_layer(layer, configs.Default8BitOutputQuantizeConfig())

    with quantize.quantize_scope():
        return tf_keras.models.clone_model(model, clone_function=annotate)


def _folded_batch_norms(model: Any) -> set[str]:
    """BatchNormalization layers right after a linear conv / dense layer: tfmot's layout
    transform folds those into the conv (and only when they carry no config of their own)."""
    folded = set()
    for layer in model.layers:
        if type(layer).__name__ not in ("BatchNormalization", "SyncBatchNormalization"):
            continue
        inputs = [node.inbound_layers for node in layer._inbound_nodes]   # noqa: SLF001
        if len(inputs) == 1 and not isinstance(inputs[0], list) and type(inputs[0]).__name__ \
                in FOLDING_LAYERS and inputs[0].get_config().get("activation") == "linear":
            folded.add(layer.name)
    return folded


def qat_blockers(model: Any) -> list[str]:
    """'layer (Class)' for each layer int8 QAT cannot handle in `model`: a matrix / conv kernel
    tfmot has no config for (it would stay float), a TF-op layer other than scalar
    arithmetic, a nested model."""
    registry = _registry()
    blockers = []
    for layer, entry in zip(model.layers, layer_entries(model)):
        kind = type(layer).__name__
        if hasattr(layer, "layers"):
            blockers.append(f"{layer.name} (nested model {kind})")
        elif kind in OP_LAYERS and not scalar_affine(entry):
            blockers.append(f"{layer.name} ({kind} {entry['config'].get('function', '?')})")
        elif not registry.supports(layer) and kind not in FLOAT_TABLES + TRANSFORMED and any(
                len(weight.shape) >= 2 for weight in layer.weights):
            blockers.append(f"{layer.name} ({kind})")
    return blockers


def _registry() -> Any:
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry as registry,
    )

    return registry.Default8BitQuantizeRegistry()
