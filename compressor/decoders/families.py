"""The decoder families compressor reads shapes of, one declarative entry each: what the
transformers config class assumes when config.json leaves a key out (transformers 5.x
defaults) and how the family lays out its tensors, sliding windows and rotary caches.

Adding a dense family is one `register_family(...)` (the built-in ones are at the bottom):
shapes.py turns a config of it into a ModelShape, infer.py recognises its tensor names,
gguf_header.py its llama.cpp architecture, and `compress plan` counts it. A family whose
tensors the standard inventory does not describe (mixtures of experts, other tensor names)
says `layout="counted"`: its tensors are listed from transformers' own model built on the
meta device (decoders/counting.py's hook). Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from compressor.registry import Registry

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Sliding:
    """Which layers use the sliding window when config.json has no `layer_types` (default:
    every layer)."""

    opt_in: bool = False        # only with `use_sliding_window: true` (Qwen2, Qwen3)
    every_layer: bool = False   # every layer, whatever `layer_types` says (Mistral, Phi-3)
    full_every: int = 0         # every n-th layer is full attention, the others slide (Gemma)
    full_every_key: str = ""    # the config key that overrides full_every
    sliding_from_key: str = ""  # layers from config[key] on slide, those before are full
    sliding_from: int = 0       # the default of that key

    def layer_types(self, cfg: dict, layers: int) -> list[str] | None:
        if self.full_every:
            n = int(cfg.get(self.full_every_key, self.full_every)) if self.full_every_key \
                else self.full_every
            return [SLIDING if (i + 1) % n else FULL for i in range(layers)]
        if self.sliding_from_key:
            first = int(cfg.get(self.sliding_from_key, self.sliding_from))
            return [SLIDING if i >= first else FULL for i in range(layers)]
        return None


@dataclass(frozen=True)
class Family:
    name: str                            # config.json's model_type
    tie_word_embeddings: bool = False    # when config.json leaves the key out
    head_dim: int | None = None          # when config.json leaves it out; None: hidden // heads
    qkv_bias: bool = False               # q / k / v always carry a bias (Qwen2)
    attention_bias_on_o: bool = True     # `attention_bias: true` biases o_proj too
    mlp_bias: bool = False               # `mlp_bias: true` biases gate / up / down (Llama)
    qk_norm: bool = False                # per-head RMSNorm on q and k (Qwen3, Gemma 3)
    norms_per_layer: int = 2             # 4: pre / post feed-forward norms too (Gemma 2, 3)
    fused_projections: bool = False      # qkv_proj and gate_up_proj stored fused (Phi-3)
    float32_norms: bool = False          # onnxruntime-genai keeps its norms float32 in fp16
    sliding_window: int | None = None    # the window when config.json names none
    sliding: Sliding = field(default_factory=Sliding)
    rope_caches: str = "one"             # "one" | "global_local" (a cos/sin pair each, Gemma 3)
    #                                      | "long_short" (LongRoPE's two when the original
    #                                      context differs, Phi-3)
    aliases: tuple[str, ...] = ()        # other model_type spellings of it ("gemma3")
    gguf_architecture: str = ""          # llama.cpp's general.architecture; "": the name
    gguf_loads: bool = False             # its .gguf files load here (standard blk.N.* names)
    missing_routes: tuple[tuple[str, str], ...] = ()   # (format, why compressor cannot write
    #                                      it): refused before any work, naming a route that works
    layout: str = "standard"             # "standard": the q/k/v/o + gate/up/down tensors
    #                                      shapes.py lists; "counted": transformers' own model
    #                                      counted on the meta device (MoE, other tensor names)

    def __post_init__(self) -> None:
        if not self.gguf_architecture:
            object.__setattr__(self, "gguf_architecture", self.name)


_FAMILIES: Registry[Family] = Registry("family")


def register_family(family: Family | None = None, /, **fields) -> Family:
    """Add a family: `register_family(name="llama", ...)` or `register_family(Family(...))`."""
    family = family or Family(**fields)
    return _FAMILIES.add(family.name, family)


def unregister_family(name: str) -> None:
    """Remove a family (tests that register a toy one)."""
    _FAMILIES.remove(name)


def registered_families() -> tuple[Family, ...]:
    return tuple(_FAMILIES)


def family_names() -> list[str]:
    return list(_FAMILIES.names())


def find_family(model_type: str) -> Family | None:
    """The family a config's model_type names (its own name or an alias), if registered."""
    return _FAMILIES.get(model_type) or next(
        (f for f in _FAMILIES if model_type in f.aliases), None)


def missing_route(family: Family | None, fmt: str) -> str | None:
    """Why compressor cannot write `family` as `fmt` (None: it can, or nothing is known)."""
    return dict(family.missing_routes).get(fmt) if family else None


def gguf_loadable_architectures() -> tuple[str, ...]:
    """The llama.cpp architectures whose .gguf files load here."""
    return tuple(f.gguf_architecture for f in _FAMILIES if f.gguf_loads)


def gguf_family(architecture: str) -> Family | None:
    return next((f for f in _FAMILIES if f.gguf_architecture == architecture), None)


def family_from_tensors(fused: bool, norms: int, qk_norm: bool, q_bias: bool) -> Family:
    """The standard-layout family a checkpoint's layer-0 tensor names point to: narrowed by
    fused projections, norms per layer, q/k norms and a q bias in turn (a test that would
    leave none is skipped), the first registered of what is left."""
    candidates = [f for f in _FAMILIES if f.layout == "standard"]
    for matches in (lambda f: f.fused_projections == fused, lambda f: f.norms_per_layer == norms,
                    lambda f: f.qk_norm == qk_norm, lambda f: f.qkv_bias == q_bias):
        candidates = [f for f in candidates if matches(f)] or candidates
    return candidates[0]


# --- the built-in families, in the order tensor names are matched -------------------------

register_family(name="llama", mlp_bias=True, gguf_loads=True)
register_family(name="mistral", sliding_window=4096, sliding=Sliding(every_layer=True))
register_family(name="qwen2", qkv_bias=True, attention_bias_on_o=False, gguf_loads=True,
                sliding=Sliding(opt_in=True, sliding_from_key="max_window_layers",
                                sliding_from=28))
register_family(name="qwen3", head_dim=128, qk_norm=True, gguf_loads=True,
                sliding=Sliding(opt_in=True, sliding_from_key="max_window_layers",
                                sliding_from=28))
register_family(name="gemma2", tie_word_embeddings=True, head_dim=256, norms_per_layer=4,
                float32_norms=True, sliding_window=4096, sliding=Sliding(full_every=2))
register_family(name="gemma3_text", tie_word_embeddings=True, head_dim=256, qk_norm=True,
                norms_per_layer=4, float32_norms=True, sliding_window=4096,
                sliding=Sliding(full_every=6, full_every_key="sliding_window_pattern"),
                rope_caches="global_local", aliases=("gemma3",), gguf_architecture="gemma3")
register_family(name="phi3", fused_projections=True, sliding=Sliding(every_layer=True),
                rope_caches="long_short")
register_family(name="gemma", tie_word_embeddings=True, head_dim=256)   # Gemma 1 (norms: io dtype)
register_family(name="granite", mlp_bias=True)
register_family(name="smollm3", tie_word_embeddings=True, mlp_bias=True,
                sliding=Sliding(opt_in=True))

# Counted families: transformers' own model on the meta device lists their tensors
# (backends/llm/meta_shapes.py), since the standard inventory above does not describe them.
_NO_BUILDER = "onnxruntime-genai's model builder has no route for this mixture of experts; export tflite"
register_family(name="olmo2", layout="counted", missing_routes=(
    ("onnx", "onnxruntime-genai's model builder has no OLMo 2 (its OlmoForCausalLM is OLMo 1); "
             "export tflite"),))
register_family(name="qwen3_moe", layout="counted",
                sliding=Sliding(opt_in=True), missing_routes=(("onnx", _NO_BUILDER),))
register_family(name="mixtral", layout="counted", missing_routes=(("onnx", _NO_BUILDER),))
register_family(name="gpt2", layout="counted", missing_routes=(
    ("onnx", "onnxruntime-genai's model builder has no GPT-2 route; export tflite"),))
register_family(name="gpt_neox", layout="counted", gguf_architecture="gptneox", missing_routes=(
    ("onnx", "onnxruntime-genai's model builder has no GPT-NeoX route; export tflite"),))
