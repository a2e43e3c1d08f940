"""What the ONNX route of a causal LM cannot write, known from config.json alone: refused before
any work (`onnx_route_refusal`), where it would otherwise fail after the whole conversion.

The route is onnxruntime-genai's model builder (0.18) and onnxruntime's CPU kernels
(genai.py). What they cannot take:
- an architecture the builder does not dispatch (`architectures[0]`: read from the text of
  its builder.py, never imported here; OLMo 2, mixtures of experts, GPT-2, GPT-NeoX, ...);
- a head size the attention kernel refuses: the builder's CPU graph runs attention as
  GroupQueryAttention with the rotary embedding inside it, and onnxruntime's
  group_query_attention_helper.h checks `head_size % 8 == 0` always and `head_size % 16 == 0`
  when it rotates (cos / sin caches given; rotary width `cos_cache.shape[1] * 2` a multiple of
  16 too). Measured: head sizes 8, 12, 20, 24 convert and then fail on the first forward pass;
  16, 32 run;
- a RoPE variant it has no code for (its base make_rope_init: default, linear, yarn; Llama's
  replaces it: llama3 only, any other ignored without a word; longrope in Phi-3's), and
  Gemma 3 with scaled RoPE on its global layers (its Gemma 3 scales the sliding layers' too).
Pure Python: no torch, onnxruntime or transformers import.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

FIX = "export tflite instead (--format tflite)"
# RoPE types the builder's make_rope_init computes: the base class's, and those builders
# that replace it (Llama's reads llama3 and silently ignores any other: wrong tables)
BASE_ROPE = frozenset({"default", "linear", "yarn"})
ROPE_BY_ARCHITECTURE = {"LlamaForCausalLM": {"default", "llama3"},
                        "NemotronForCausalLM": {"default", "llama3"},
                        "SmolLM3ForCausalLM": {"default", "llama3"},
                        "Phi3ForCausalLM": BASE_ROPE | {"longrope"},
                        "HunYuanDenseV1ForCausalLM": {"default", "dynamic"}}


def onnx_route_refusal(config: dict) -> str | None:
    """One line naming why the ONNX route cannot write this model and what to do instead, or
    None when nothing in `config` (a config.json's dict) rules it out."""
    text = {**(config.get("text_config") or {}), **config}   # the builder reads it so too
    for check in (_architecture, _head_size, _rope):
        reason = check(text)
        if reason:
            return reason
    return None


@functools.lru_cache(maxsize=1)
def builder_architectures() -> frozenset[str] | None:
    """The `architectures[0]` values onnxruntime-genai's builder.py dispatches on; None when
    onnxruntime-genai is not installed (its own error says so when the route runs)."""
    spec = importlib.util.find_spec("onnxruntime_genai")   # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(list(spec.submodule_search_locations)[0]) / "models" / "builder.py"
    if not source.is_file():
        return None
    found = re.findall(r"""architectures\[0\]\s*==\s*["']([A-Za-z0-9_]+)["']""",
                       source.read_text(encoding="utf-8", errors="replace"))
    return frozenset(found) or None


def _architecture(config: dict) -> str | None:
    architecture = (config.get("architectures") or [None])[0]
    known = builder_architectures()
    if not architecture or known is None or architecture in known:
        return None
    family = config.get("model_type") or "this family"
    return (f"the ONNX route cannot convert {architecture} ({family}): onnxruntime-genai's "
            f"model builder has no {architecture}; try --format tflite instead")


def head_size(config: dict) -> int | None:
    heads = config.get("num_attention_heads")
    if config.get("head_dim"):
        return int(config["head_dim"])
    if heads and config.get("hidden_size"):
        return int(config["hidden_size"]) // int(heads)
    return None


def _uses_rope(config: dict) -> bool:
    """Whether any layer rotates (SmolLM3's `no_rope_layers`: 0 = no RoPE in that layer)."""
    no_rope = config.get("no_rope_layers")
    return not (isinstance(no_rope, list) and no_rope and not any(no_rope))


def _head_size(config: dict) -> str | None:
    size = head_size(config)
    if size is None:
        return None
    rotates = _uses_rope(config)
    multiple = 16 if rotates else 8
    factor = float(config.get("partial_rotary_factor") or _flat_rope(config).get(
        "partial_rotary_factor") or 1.0)
    rotary = int(size * factor)
    where = "onnxruntime's GroupQueryAttention (the ONNX route's attention on CPU)"
    if size % multiple:
        why = " with rotary embeddings" if rotates else ""
        return (f"head size {size} is not a multiple of {multiple}: {where} refuses it{why}; "
                f"{FIX}")
    if rotates and factor != 1.0 and rotary % 16:
        return (f"rotary width {rotary} (head size {size} x partial_rotary_factor {factor:g}) "
                f"is not a multiple of 16: {where} refuses it; {FIX}")
    return None


def _flat_rope(config: dict) -> dict:
    """The RoPE parameters of the global layers: rope_parameters (flat or per layer type),
    else the Hub's older rope_scaling."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        return {}
    nested = rope.get("full_attention")
    return nested if isinstance(nested, dict) else rope


def _rope(config: dict) -> str | None:
    rope = _flat_rope(config)
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    architecture = str((config.get("architectures") or [""])[0])
    if kind not in ROPE_BY_ARCHITECTURE.get(architecture, BASE_ROPE):
        return (f"RoPE type {kind!r}: onnxruntime-genai's model builder has no code for it in "
                f"{architecture or 'this architecture'}; {FIX}")
    sliding = "sliding_attention" in (config.get("layer_types") or ()) or config.get(
        "sliding_window_pattern")
    if architecture.startswith("Gemma3") and kind != "default" and sliding:
        return (f"Gemma 3 with {kind} RoPE scaling on its global layers: onnxruntime-genai's "
                f"model builder would scale its sliding layers' RoPE too (wrong outputs); {FIX}")
    return None
