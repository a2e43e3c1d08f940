"""Which post-training int8 mode suits a model, from the kinds of layers it has.

Static int8 (weights and activations, calibrated) is fastest and holds accuracy on conv /
dense nets. Attention, LayerNorm, embeddings and recurrent layers carry activations whose
ranges a static calibration cannot fix (measured: a BERT-style sentence encoder fell to mean
cosine 0.33 with static int8 of every op, 0.99 with dynamic int8), so such models get dynamic
int8: per-channel int8 weights, activations quantized at run time.
"""
from __future__ import annotations

from collections.abc import Iterable

# layer kind -> fragments of framework class / op names (Keras, PyTorch, Hugging Face, ONNX)
KIND_FRAGMENTS = {
    "attention": ("Attention", "scaled_dot_product"),
    "layernorm": ("LayerNorm", "layer_norm"),
    "embedding": ("Embedding", "aten.embedding"),
    "recurrent": ("LSTM", "GRU", "SimpleRNN", "aten.lstm", "aten.gru", "aten.rnn"),
}


def layer_kinds(names: Iterable[str]) -> frozenset[str]:
    """The sequence-model layer kinds that class or op names reveal."""
    names = list(names)
    return frozenset(kind for kind, fragments in KIND_FRAGMENTS.items()
                     if any(f in name for name in names for f in fragments))


def post_training_mode(kinds: frozenset[str]) -> tuple[str, str]:
    """(quantize mode, why) for a `ptq` step: ptq (static) or dynamic."""
    if "causal_lm" in kinds:
        return "weight_only", ("weight-only int8 (a scale per group of weights, float compute): a "
                               "language model decodes one token at a time, so its speed is the "
                               "weight bytes read per token, not the arithmetic")
    if not kinds:
        return "ptq", "static int8 (weights and activations, calibrated): conv / dense layers only"
    return "dynamic", (f"dynamic int8 (int8 weights, activations quantized at run time): the model "
                       f"has {', '.join(sorted(kinds))} layers, whose activations static "
                       "calibration quantizes badly")
