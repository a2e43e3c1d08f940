"""Intermediate-feature distillation for Keras (`distill.feature_pairs`).

The student trains inside a wrapper model that shares all its layers: same inputs and outputs
(so the task / KD loss is unchanged), plus `feature_weight * sum MSE(projection(student
feature), teacher feature)` added with `add_loss`. The frozen teacher's feature layers run
inside that graph in inference mode, on the same batch. A projection (a Dense over the
channel axis, i.e. a 1x1 conv for NHWC features) is trained when the widths differ; the
wrapper and the projections are dropped after the step, the student is returned as it is.
"""
from __future__ import annotations

from typing import Any

from compressor.backends.feature_pairs import needs_projection, resolve_pairs
from compressor.backends.keras.env import import_tensorflow, import_tf_keras
from compressor.errors import RecipeError
from compressor.config.steps import DistillConfig, TrainingConfig

CHANNEL_AXIS = -1   # NHWC / (N, L, C) / (N, C) features


def with_feature_terms(student: Any, config: TrainingConfig, teacher: Any) -> Any:
    """The model to fit: `student` itself, or for a distill step with feature_pairs a wrapper
    sharing its layers whose loss adds the feature terms."""
    if not isinstance(config, DistillConfig) or not config.feature_pairs:
        return student
    tf_keras, tf = import_tf_keras(), import_tensorflow()
    pairs = resolve_pairs(config.feature_pairs, _names(student), _names(teacher))
    student_features = [_output(student, name) for name, _ in pairs]
    teacher_model = tf_keras.Model(teacher.inputs, [_output(teacher, name) for _, name in pairs])
    teacher_model.trainable = False
    inputs = student.inputs if len(student.inputs) > 1 else student.inputs[0]
    teacher_features = teacher_model(inputs, training=False)
    if len(pairs) == 1:
        teacher_features = [teacher_features]
    terms = []
    for index, (pair, s, t) in enumerate(zip(pairs, student_features, teacher_features)):
        if needs_projection(pair, s.shape, t.shape, CHANNEL_AXIS):
            s = tf_keras.layers.Dense(t.shape[CHANNEL_AXIS], name=f"feature_projection_{index}")(s)
        terms.append(tf.reduce_mean(tf.square(s - tf.stop_gradient(t))))
    training = tf_keras.Model(student.inputs, student.outputs, name=f"{student.name}_features")
    training.add_loss(config.feature_weight * tf.add_n(terms))
    return training


def _names(model: Any) -> list[str]:
    return [layer.name for layer in getattr(model, "layers", [])]


def _output(model: Any, name: str) -> Any:
    """The layer's symbolic output in `model`'s graph; a layer used more than once (shared)
    has no single output: say which."""
    try:
        return model.get_layer(name).output
    except AttributeError:
        raise RecipeError(f"distill feature_pairs: layer {name!r} of {model.name} is called "
                          "more than once (shared), so it has no single feature; pick another "
                          "layer") from None
