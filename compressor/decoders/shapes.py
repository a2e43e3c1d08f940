"""The shape of a decoder-only language model, read from its Hugging Face config alone.

`ModelShape` holds what decides bytes and speed (widths, heads, layers, tied embeddings,
biases, norms, sliding windows); `tensor_inventory` lists every weight tensor the
transformers class creates, so `param_count` equals `sum(p.numel())` of
`AutoModelForCausalLM.from_config(config)` (tests build each family on the meta device to
prove it).

A standard family (families.py) is listed from its entry here, the fast path; a family
registered with `layout="counted"`, or a model_type transformers ships as a causal LM that no
entry describes, is counted by the counter installed in decoders/counting.py (transformers'
own model on the meta device): its ModelShape carries that `inventory`, mixture-of-experts
tensors [experts, out, in] with the share of experts a token reads. Pure Python: no framework
is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compressor.decoders.counting import counter
from compressor.decoders.families import Family, family_names, find_family
from compressor.errors import ModelLoadError

# router: a mixture of experts' gate, which exporters keep float (counted at io bytes)
KINDS = ("embedding", "lm_head", "attention", "mlp", "norm", "bias", "router")
# a layer's norms, the first `norms_per_layer` of them
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm")


@dataclass(frozen=True)
class ModelShape:
    name: str
    family: str                         # the config's model_type ("llama", "gemma3_text", ...)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    layer_windows: tuple[int | None, ...]   # per layer: its sliding window, None = full attention
    max_position_embeddings: int
    rope_cache_rows: tuple[int, ...] = ()  # rows of each cos/sin cache pair an exporter writes
    rotary_dim: int = 0
    biases: frozenset[str] = frozenset()   # projections with a bias: q k v o gate up down
    qk_norm: bool = False                  # per-head RMSNorm on q and k (Qwen3, Gemma 3)
    norms_per_layer: int = 2
    fused_projections: bool = False        # Phi-3 stores qkv_proj and gate_up_proj fused
    source: str = ""
    inventory: tuple[TensorSpec, ...] = ()  # counted on the meta device; () = the family's table

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class TensorSpec:
    name: str                  # the Hugging Face parameter name
    kind: str                  # one of KINDS
    shape: tuple[int, ...]     # (out_features, in_features) for linears, as torch stores them
    layer: int | None = None   # decoder layer index; None for embedding, lm_head, final norm
    tied: bool = False         # lm_head that reuses the embedding matrix (no storage of its own)
    experts: int = 0           # stacked experts: shape [experts, out, in] ([experts, out]: biases)
    active_experts: int = 0    # of them, how many one token reads (num_experts_per_tok)
    transposed: bool = False   # torch stores it [in, out] (GPT-2's Conv1D); shape is (out, in)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def active(self) -> float:
        """The share of this tensor one token reads (active experts / experts; else 1)."""
        return self.active_experts / self.experts if self.experts else 1.0

    @property
    def active_numel(self) -> int:
        return self.numel // self.experts * self.active_experts if self.experts else self.numel

    @property
    def matrix(self) -> tuple[int, ...]:
        """One expert's shape (the whole shape when not stacked)."""
        return self.shape[1:] if self.experts else self.shape

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape as torch (and a checkpoint) stores it."""
        return (*self.shape[:-2], self.shape[-1], self.shape[-2]) if self.transposed else self.shape


def _int(cfg: dict, key: str, where: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{where}: config key {key!r} = {value!r}, but it must be a positive "
                             "integer (is this a causal-LM config.json?)")
    return value


def _windows(cfg: dict, family: Family, layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window", family.sliding_window)
    if family.sliding.opt_in and not cfg.get("use_sliding_window", False):
        window = None
    if not window:
        return (None,) * layers
    types = None if family.sliding.every_layer else \
        cfg.get("layer_types") or family.sliding.layer_types(cfg, layers)
    if not types:
        return (int(window),) * layers
    return tuple(int(window) if t == "sliding_attention" else None for t in types[:layers])


def _rope(cfg: dict, family: Family, head_dim: int, max_pos: int) -> tuple[tuple[int, ...], int]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    factor = next((f for f in (cfg.get("partial_rotary_factor"), rope.get("partial_rotary_factor"))
                   if f is not None), 1.0)
    rotary_dim = int(head_dim * float(factor))
    original = cfg.get("original_max_position_embeddings", max_pos)
    if family.rope_caches == "long_short" and original != max_pos:   # LongRoPE: long and short
        return (max_pos, int(original)), rotary_dim
    if family.rope_caches == "global_local":         # global and local (sliding) caches
        return (max_pos, max_pos), rotary_dim
    return (max_pos,), rotary_dim


def text_config(config: dict) -> dict:
    """config.json, or a multimodal config's `text_config` (its language model)."""
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        text.setdefault("model_type", f"{cfg.get('model_type', '')}_text")
        if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in text:
            text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        cfg = text
    return cfg


def is_language_model(config: dict) -> bool:
    """Whether a config.json describes a causal LM of a family this module knows, or (with a
    counter installed: decoders/counting.py) one transformers ships."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    family = str(cfg.get("model_type", config.get("model_type", "")))
    if find_family(family) is not None or find_family(f"{family}_text") is not None:
        return True
    count = counter()
    return bool(count is not None and count.knows(text_config(config)))


def _counted(cfg: dict, family: Family | None, where: str) -> tuple[dict, tuple[TensorSpec, ...]]:
    """config.json's keys as transformers resolves them, and the tensors of transformers' own
    model (the installed counter); unknown model types are refused."""
    model_type = str(cfg.get("model_type", ""))
    count = counter()
    if count is not None and (family is not None or count.knows(cfg)):
        numbers, inventory = count.count(cfg)
        return {**cfg, **numbers}, tuple(inventory)
    if family is not None:
        raise ModelLoadError(f"{where}: {model_type} models are counted from transformers' own "
                             "model (compress plan, or the language-model backend, counts them)")
    shipped = " or one transformers ships as a causal LM" if count is not None else ""
    raise ModelLoadError(f"{where}: model_type {model_type!r} is not a language-model family "
                         f"compress plan knows ({', '.join(sorted(family_names()))}){shipped}; "
                         "give one of those or a built-in name (compress plan --list)")


def from_hf_config(config: dict, name: str = "", source: str = "") -> ModelShape:
    """A ModelShape from config.json's contents (a multimodal config's `text_config` is used
    for its language model). A standard family is listed from its entry; a counted one, or a
    model type transformers ships that no entry describes, by the installed counter. Others
    are refused: their counts would be guesses."""
    where = source or name or "config.json"
    cfg = text_config(config)
    family = find_family(str(cfg.get("model_type", "")))
    inventory: tuple[TensorSpec, ...] = ()
    if family is None or family.layout != "standard":
        cfg, inventory = _counted(cfg, family, where)
        family = family or Family(name=str(cfg.get("model_type", "")))
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    layers = _int(cfg, "num_hidden_layers", where)
    head_dim = cfg.get("head_dim") or family.head_dim or hidden // heads
    max_pos = _int(cfg, "max_position_embeddings", where, 2048)
    rope_rows, rotary_dim = _rope(cfg, family, int(head_dim), max_pos)
    attention_bias = bool(cfg.get("attention_bias", False))
    biases = set()
    if family.qkv_bias or attention_bias:
        biases |= {"q", "k", "v"}
    if attention_bias and family.attention_bias_on_o:
        biases.add("o")
    if cfg.get("mlp_bias", False) and family.mlp_bias:
        biases |= {"gate", "up", "down"}
    counted = {"biases": frozenset(cfg["counted_biases"]), "qk_norm": cfg["counted_qk_norm"],
               "norms_per_layer": cfg["counted_norms_per_layer"], "fused_projections": False,
               "inventory": inventory} if inventory else {}
    return ModelShape(**{
        "name": name or str(cfg.get("_name_or_path", "")) or family.name, "family": family.name,
        "vocab_size": _int(cfg, "vocab_size", where), "hidden_size": hidden,
        "intermediate_size": _int(cfg, "intermediate_size", where), "num_layers": layers,
        "num_heads": heads, "num_kv_heads": _int(cfg, "num_key_value_heads", where, heads),
        "head_dim": _int({"head_dim": head_dim}, "head_dim", where),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", family.tie_word_embeddings)),
        "layer_windows": _windows(cfg, family, layers), "max_position_embeddings": max_pos,
        "rope_cache_rows": rope_rows, "rotary_dim": rotary_dim, "biases": frozenset(biases),
        "qk_norm": family.qk_norm, "norms_per_layer": family.norms_per_layer,
        "fused_projections": family.fused_projections, "source": source, **counted})


def _layer_tensors(s: ModelShape, i: int) -> list[TensorSpec]:
    p = f"model.layers.{i}."
    h, inter = s.hidden_size, s.intermediate_size
    out: list[TensorSpec] = []
    if s.fused_projections:
        out.append(TensorSpec(p + "self_attn.qkv_proj.weight", "attention",
                              (s.q_width + 2 * s.kv_width, h), i))
    else:
        for proj, width in (("q", s.q_width), ("k", s.kv_width), ("v", s.kv_width)):
            out.append(TensorSpec(f"{p}self_attn.{proj}_proj.weight", "attention", (width, h), i))
    out.append(TensorSpec(p + "self_attn.o_proj.weight", "attention", (h, s.q_width), i))
    if s.fused_projections:
        out.append(TensorSpec(p + "mlp.gate_up_proj.weight", "mlp", (2 * inter, h), i))
    else:
        out += [TensorSpec(p + "mlp.gate_proj.weight", "mlp", (inter, h), i),
                TensorSpec(p + "mlp.up_proj.weight", "mlp", (inter, h), i)]
    out.append(TensorSpec(p + "mlp.down_proj.weight", "mlp", (h, inter), i))
    widths = {"q": s.q_width, "k": s.kv_width, "v": s.kv_width, "o": h, "gate": inter,
              "up": inter, "down": h}
    for proj in ("q", "k", "v", "o", "gate", "up", "down"):
        if proj in s.biases:
            module = "self_attn" if proj in "qkvo" else "mlp"
            out.append(TensorSpec(f"{p}{module}.{proj}_proj.bias", "bias", (widths[proj],), i))
    names = LAYER_NORMS[:s.norms_per_layer]
    out += [TensorSpec(p + n + ".weight", "norm", (h,), i) for n in names]
    if s.qk_norm:
        out += [TensorSpec(p + "self_attn.q_norm.weight", "norm", (s.head_dim,), i),
                TensorSpec(p + "self_attn.k_norm.weight", "norm", (s.head_dim,), i)]
    return out


def tensor_inventory(s: ModelShape) -> list[TensorSpec]:
    """Every weight tensor, in the order transformers creates them; a tied lm_head is listed
    (exporters quantize it) but marked `tied` and holds no parameters of its own. A counted
    shape's own inventory when it carries one."""
    if s.inventory:
        return list(s.inventory)
    tensors = [TensorSpec("model.embed_tokens.weight", "embedding", (s.vocab_size, s.hidden_size))]
    for i in range(s.num_layers):
        tensors += _layer_tensors(s, i)
    tensors.append(TensorSpec("model.norm.weight", "norm", (s.hidden_size,)))
    tensors.append(TensorSpec("lm_head.weight", "lm_head", (s.vocab_size, s.hidden_size),
                              tied=s.tie_word_embeddings))
    return tensors


def params_by_kind(s: ModelShape, active: bool = False) -> dict[str, int]:
    """Parameters per tensor kind; `active`: those one token reads (a mixture of experts'
    active experts only)."""
    counts = dict.fromkeys(KINDS, 0)
    for t in tensor_inventory(s):
        if not t.tied:
            counts[t.kind] += t.active_numel if active else t.numel
    return counts


def param_count(s: ModelShape) -> int:
    """sum(p.numel()) of the transformers model (a tied lm_head counted once, as torch does)."""
    return sum(params_by_kind(s).values())


def active_param_count(s: ModelShape) -> int:
    """The parameters one token reads: every expert's share x the experts it is routed to
    (equal to param_count for a dense model)."""
    return sum(params_by_kind(s, active=True).values())
