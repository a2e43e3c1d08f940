"""A decoder's tensors counted from transformers' own model built on the meta device (no
memory, no weights, no download): the counter decoders/counting.py takes, for the families
registered with `layout="counted"` (mixtures of experts, tensor names other than the standard
ones) and the model types transformers ships as causal LMs that no family entry describes.

Every named parameter becomes a shapes.TensorSpec: its kind (embedding, position embeddings
included; lm_head, tied when it is the embedding's tensor; attention; mlp, experts included;
norm; bias; router: a mixture of experts' gate, kept float by the exporters), its decoder
layer, and for stacked experts (transformers 5 stores them [experts, out, in]) how many of
them a token reads (num_experts_per_tok). GPT-2's Conv1D weights are stored [in, out]: their
TensorSpec says so (`transposed`) and lists them (out, in) as the planner counts a matrix.

Experts kept as a list of per-expert modules (no shipped decoder of transformers 5 does) are
counted as dense layers: every expert read per token, an upper bound on decode bytes.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from compressor.decoders.shapes import TensorSpec
from compressor.errors import ModelLoadError

_BUILD_ERRORS = (ValueError, TypeError, KeyError, AttributeError, AssertionError, RuntimeError,
                 IndexError, NotImplementedError)
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")


def knows(config: dict) -> bool:
    """transformers builds this config.json as a decoder-only causal LM: its causal-LM auto
    mapping has the model_type (and its masked-LM mapping, which names the encoders, does not),
    or config.json's architectures name a *ForCausalLM class transformers has."""
    try:
        _quiet_import()
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                            MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    except ImportError:
        return False
    model_type = str(config.get("model_type", ""))
    if model_type not in CONFIG_MAPPING_NAMES:
        return False
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and \
            model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return True
    return any(str(a).endswith("ForCausalLM") and hasattr(transformers, str(a))
               for a in config.get("architectures") or [])


def count(config: dict) -> tuple[dict, tuple[TensorSpec, ...]]:
    """(config.json keys as transformers resolves them, every parameter as a TensorSpec)."""
    numbers, inventory = _count(json.dumps(config, sort_keys=True, default=str))
    return dict(numbers), inventory


@lru_cache(maxsize=64)
def _count(key: str) -> tuple[dict, tuple[TensorSpec, ...]]:
    cfg = json.loads(key)
    model_type = str(cfg.get("model_type", ""))
    try:
        _quiet_import()
        import torch  # noqa: F401  (the meta device)
    except ImportError:
        raise ModelLoadError(f"counting a {model_type} model needs transformers and torch: "
                             "pip install 'compressor[llm]'") from None
    config = _config(cfg)
    model = _meta_model(config, cfg)
    inventory = tuple(_inventory(config, model))
    return _numbers(config, model, inventory), inventory


def _quiet_import() -> None:
    """transformers (and the torchao it pulls in) imported without their start-up warnings."""
    from compressor.backends.llm.load import quiet_transformers

    quiet_transformers()


def _config(cfg: dict) -> Any:
    from transformers import AutoConfig

    raw = {k: v for k, v in cfg.items() if k != "model_type"}
    vocab = raw.get("vocab_size")
    if isinstance(vocab, int) and isinstance(raw.get("pad_token_id"), int) and raw["pad_token_id"] >= vocab:
        raw["pad_token_id"] = None     # an embedding's padding row must lie in the vocabulary
    try:
        return AutoConfig.for_model(cfg["model_type"], **raw)
    except _BUILD_ERRORS as e:
        raise ModelLoadError(f"transformers cannot read this {cfg['model_type']} config.json "
                             f"({e}); give the model's own config.json") from None


def _meta_model(config: Any, cfg: dict) -> Any:
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        build = transformers.AutoModelForCausalLM.from_config
    else:
        arch = next((str(a) for a in cfg.get("architectures") or [] if hasattr(transformers, str(a))),
                    None)
        if arch is None:
            raise ModelLoadError(f"transformers has no causal-LM class for {config.model_type} "
                                 "models; give a config.json whose architectures name one")
        build = getattr(transformers, arch)._from_config
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with torch.device("meta"):
            return build(config)
    except _BUILD_ERRORS as e:
        raise ModelLoadError(f"transformers cannot build this {config.model_type} config.json "
                             f"as a causal LM ({e}); give the model's own config.json") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def _top_k(config: Any, experts: int) -> int:
    """The experts a token is routed to (all of them when the config names no top-k)."""
    top_k = next((int(v) for k in _TOP_K if isinstance(v := getattr(config, k, None), int)), experts)
    return min(top_k, experts)


def _layers_prefix(model: Any, layers: int) -> str:
    """The name prefix of the decoder layers ("model.layers.", "transformer.h.")."""
    import torch

    return next((f"{name}." for name, m in model.named_modules()
                 if isinstance(m, torch.nn.ModuleList) and len(m) == layers), "\0")


def _in_attention(name: str) -> bool:
    """The parameter lies in an attention module (self_attn, attn, attention, ...)."""
    return any(("attn" in part or "attention" in part) and "norm" not in part
               for part in name.split(".")[:-1])


def _kind(name: str, param: Any, module: Any, parent: Any, embeddings: tuple) -> str:
    import torch

    leaf = name.rpartition(".")[0].rpartition(".")[2]     # the owning module's own name
    if module is embeddings[1]:
        return "lm_head"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if "norm" in type(module).__name__.lower() or "norm" in leaf:
        return "norm"
    if "router" in type(module).__name__.lower() or (
            hasattr(parent, "experts") and (leaf == "gate" or leaf.endswith("_gate"))):
        return "router"
    if name.endswith("bias"):
        return "bias"
    if param.dim() < 2:
        return "norm"                 # a learned scale or scalar: float, like a norm's
    return "attention" if _in_attention(name) else "mlp"


def _inventory(config: Any, model: Any) -> list[TensorSpec]:
    from transformers.pytorch_utils import Conv1D

    modules = dict(model.named_modules())
    embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
    prefix = _layers_prefix(model, config.num_hidden_layers)
    out = []
    for name, p in model.named_parameters():
        owner = name.rpartition(".")[0]
        module, parent = modules.get(owner), modules.get(owner.rpartition(".")[0])
        layer = int(name[len(prefix):].split(".")[0]) if name.startswith(prefix) else None
        shape = tuple(int(d) for d in p.shape)
        transposed = isinstance(module, Conv1D) and name.endswith("weight")
        if transposed:
            shape = shape[::-1]
        stacked = (type(module).__name__.endswith("Experts") or owner.endswith("experts")) \
            and len(shape) >= 2
        experts = shape[0] if stacked else 0
        out.append(TensorSpec(name, _kind(name, p, module, parent, embeddings), shape, layer,
                              experts=experts, active_experts=_top_k(config, experts) if experts else 0,
                              transposed=transposed))
    head, embed = embeddings[1], embeddings[0]
    if head is not None and embed is not None and head.weight is embed.weight:
        head_name = next(n for n, m in modules.items() if m is head)
        out.append(TensorSpec(f"{head_name}.weight", "lm_head", tuple(embed.weight.shape), tied=True))
    return out


def _numbers(config: Any, model: Any, inventory: tuple[TensorSpec, ...]) -> dict:
    """config.json keys the ModelShape is made of, as the config class resolves them (its
    defaults, its attribute_map); a mixture of experts' intermediate size is one expert's
    width x the experts a token reads (its activations' fair width)."""
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    stacked = [t for t in inventory if t.experts]
    top_k = stacked[0].active_experts if stacked else 1
    width = (getattr(config, "moe_intermediate_size", None) if stacked else None) or \
        getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    resolved = {k: v for k, v in config.to_dict().items() if isinstance(k, str)}
    window = getattr(config, "sliding_window", None)
    rotary = any("rotary" in n.lower() for n, _ in model.named_modules())
    layer0 = [t for t in inventory if t.layer == 0]
    in_attention = [t for t in layer0 if _in_attention(t.name)]
    resolved.update({
        "model_type": config.model_type, "hidden_size": hidden, "num_attention_heads": heads,
        "num_hidden_layers": int(config.num_hidden_layers), "vocab_size": int(config.vocab_size),
        "num_key_value_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(config, "head_dim", None) or hidden // heads),
        "intermediate_size": int(width) * top_k,
        "max_position_embeddings": int(getattr(config, "max_position_embeddings", None) or 2048),
        "tie_word_embeddings": any(t.tied for t in inventory),
        "sliding_window": window if getattr(config, "use_sliding_window", True) is not False else None,
        "counted_biases": sorted({t.name.rsplit(".", 2)[-2] for t in layer0 if t.kind == "bias"}),
        "counted_qk_norm": any(t.kind == "norm" for t in in_attention),
        "counted_norms_per_layer": len({t.name.rsplit(".", 1)[0] for t in layer0
                                        if t.kind == "norm" and t not in in_attention})})
    if not rotary:
        resolved["partial_rotary_factor"] = 0.0     # learned positions (GPT-2): no cos/sin caches
    return resolved
