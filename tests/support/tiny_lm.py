"""A tiny causal LM and its tokenizer, built in the tests: a byte-level BPE tokenizer trained on
the built-in English corpus, tiny configs of five families, a short AdamW training run, and an
HF folder (config.json, model.safetensors, tokenizer files) a user would hand to `compress`.

Only the corpus's calibration part (TextData's text before the held-out tail) is trained on, so
perplexity on TextData's evaluation windows is measured on text the model never saw.
torch / transformers / tokenizers are imported inside the functions.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from compressor.backends.llm import examples
from compressor.backends.llm.examples import (  # noqa: F401  (the tests read them here)
    BATCH, BOS_ID, CHAT_TEMPLATE, EOS_ID, PAD_ID, SEQUENCE, SPECIAL_TOKENS, STEPS, TINY, UNK_ID,
    save_hf_folder)
from compressor.tasks.lm.text_data import SEPARATOR, TextData, bos_token_id

FAMILIES = ("llama", "llama3", "qwen2", "gemma2", "phi3", "mistral", "gemma", "gemma3_text",
            "granite", "olmo2", "smollm3", "qwen3_moe", "mixtral", "gpt2", "gpt_neox")
TIED = {"llama": True, "llama3": True, "qwen2": True, "gemma2": True, "phi3": False, "mistral": False}
CONFIG_CLASSES = {"llama": "LlamaConfig", "llama3": "LlamaConfig", "qwen2": "Qwen2Config",
                  "gemma2": "Gemma2Config", "phi3": "Phi3Config", "mistral": "MistralConfig",
                  "gemma": "GemmaConfig", "gemma3_text": "Gemma3TextConfig",
                  "granite": "GraniteConfig", "olmo2": "Olmo2Config", "smollm3": "SmolLM3Config",
                  "qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig",
                  "gpt2": "GPT2Config", "gpt_neox": "GPTNeoXConfig"}
FAMILY_EXTRAS = {
    # what Llama 3.x checkpoints carry and toy configs lack: RoPE scaled by rope_type llama3
    # (frequencies below the original context stretched 8x), widths that are not powers of two
    # (hidden 96, MLP 160), 6 query heads sharing 2 KV heads
    "llama3": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                   intermediate_size=160,
                   rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                    "rope_theta": 500000.0}),
    "gemma2": dict(query_pre_attn_scalar=16),            # 1/sqrt(head_dim) scaling, as Gemma 2
    "phi3": dict(original_max_position_embeddings=512),  # fused qkv / gate_up projections
    # one sliding and one full layer, a window shorter than the test windows
    "gemma3_text": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=64,
                        query_pre_attn_scalar=16),
    # Granite's four scalars away from 1, as the released checkpoints have them
    "granite": dict(embedding_multiplier=12.0, attention_multiplier=0.0625,
                    residual_multiplier=0.22, logits_scaling=8.0),
    "smollm3": dict(no_rope_layer_interval=2),   # layer 1 without RoPE, as SmolLM3's every 4th
    # mixtures of experts: 4 experts of MLP width 32, 2 per token
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32),
}
# The Hub's original gemma-3 config.json (before transformers 5's `rope_parameters` per layer
# type): what `gemma3_hub_form` rewrites a saved tiny Gemma 3 folder's config into.
GEMMA3_HUB_KEYS = {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                   "rope_scaling": None, "sliding_window_pattern": 2,
                   "architectures": ["Gemma3ForCausalLM"], "cache_implementation": "hybrid"}


def builtin_texts() -> tuple[str, str]:
    """The built-in corpus's (calibration text, held-out evaluation text)."""
    return TextData().texts()


def train_tokenizer(texts: str | list[str], vocab_size: int = 512, prepend_bos: bool = True) -> Any:
    """examples.train_tokenizer on `texts` (a string is split into its paragraphs)."""
    texts = texts.split(SEPARATOR) if isinstance(texts, str) else list(texts)
    return examples.train_tokenizer(texts, vocab_size, prepend_bos)


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> Any:
    """A transformers config of `family` at toy size: hidden 64, 2 layers, 4 heads, 2 KV heads
    (grouped-query attention), head_dim 16, MLP 128, 512 positions (llama3: Llama 3's RoPE
    scaling and widths, FAMILY_EXTRAS); embeddings tied for llama, llama3, qwen2, gemma2, untied
    for phi3, mistral (transformers' defaults for the rest)."""
    import transformers

    if family not in CONFIG_CLASSES:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    settings = {**TINY, "vocab_size": vocab_size, **FAMILY_EXTRAS.get(family, {}), **overrides}
    if family in TIED:
        settings.setdefault("tie_word_embeddings", TIED[family])
    return getattr(transformers, CONFIG_CLASSES[family])(**settings)


def random_lm(tokenizer: Any, family: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised tiny causal LM of `family` sized to `tokenizer`'s vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, len(tokenizer), **overrides)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def gemma3_hub_form(folder: Path) -> Path:
    """Rewrite a saved tiny Gemma 3's config.json as the Hub's original gemma-3 files are
    written (rope_theta / rope_local_base_freq / sliding_window_pattern, no rope_parameters
    nor layer_types); returns the folder."""
    import json

    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        config.pop(key, None)
    path.write_text(json.dumps({**config, **GEMMA3_HUB_KEYS}, indent=2))
    return Path(folder)


def train_tiny_lm(tokenizer: Any, texts: str | list[str], family: str = "llama",
                  steps: int = STEPS, seed: int = 0, batch: int = BATCH,
                  sequence: int = SEQUENCE) -> Any:
    """`random_lm` trained as examples.train_causal_lm trains (AdamW, warm-up, cosine decay, on
    random `sequence`-token windows of `texts`, each starting with BOS as TextData's windows do)."""
    text = texts if isinstance(texts, str) else SEPARATOR.join(texts)
    return examples.train_causal_lm(lambda: random_lm(tokenizer, family, seed), tokenizer, text,
                                    bos_token_id(tokenizer), steps=steps, seed=seed, batch=batch,
                                    sequence=sequence)


def perplexity(model: Any, windows: np.ndarray, batch: int = 8) -> float:
    """exp(mean next-token cross entropy) of `model` in torch over every position of `windows`
    after the first (each window is scored on its own, from its first token)."""
    import torch

    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(windows), batch):
            ids = torch.from_numpy(np.asarray(windows[start:start + batch], np.int64))
            logits = model(input_ids=ids).logits[:, :-1].float()
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
            total, count = total + float(losses), count + ids[:, 1:].numel()
    return math.exp(total / count)


def unigram_perplexity(calibration: np.ndarray, evaluation: np.ndarray, vocab_size: int) -> float:
    """Perplexity on `evaluation`'s scored positions (all but the first of each window) of the
    token frequencies of `calibration` (add-one smoothed): what a model without context gets."""
    counts = np.bincount(calibration.reshape(-1), minlength=vocab_size) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(np.exp(-log_p[evaluation[:, 1:].reshape(-1)].mean()))


def timed(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """(function's result, seconds it took)."""
    began = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - began
