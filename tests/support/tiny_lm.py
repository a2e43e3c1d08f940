"""A tiny causal LM and its tokenizer, built in the tests: a byte-level BPE tokenizer trained on
the built-in English corpus, tiny configs of five families, a short AdamW training run, and an
HF folder (config.json, model.safetensors, tokenizer files) a user would hand to `compress`.

Only the corpus's calibration part (TextData's text before the held-out tail) is trained on, so
perplexity on TextData's evaluation windows is measured on text the model never saw.
torch / transformers / tokenizers are imported inside the functions.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from compressor.tasks.lm.text_data import SEPARATOR, TextData, bos_token_id

FAMILIES = ("llama", "llama3", "qwen2", "gemma2", "phi3", "mistral")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")   # ids 0, 1, 2, 3 in every trained tokenizer
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=512, head_dim=16,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
TIED = {"llama": True, "llama3": True, "qwen2": True, "gemma2": True, "phi3": False, "mistral": False}
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
}
# `train_tiny_lm`'s defaults: 400 steps of 8 x 256 tokens take ~41 s of one CPU core (about
# 25 s on two) and reach a held-out perplexity near 48 (unigram 210, untrained 520).
STEPS, BATCH, SEQUENCE, LEARNING_RATE, WARMUP = 400, 8, 256, 4e-3, 30


def builtin_texts() -> tuple[str, str]:
    """The built-in corpus's (calibration text, held-out evaluation text)."""
    return TextData().texts()


def train_tokenizer(texts: str | list[str], vocab_size: int = 512, prepend_bos: bool = True) -> Any:
    """A byte-level BPE PreTrainedTokenizerFast trained on `texts`: <unk> <s> </s> <pad> as ids
    0-3, a BOS prepended to encoded text as Llama's does (`prepend_bos=False`: none, as Qwen2's),
    and a small chat template. onnxruntime-genai opens the saved files and encodes the same ids,
    without the BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = texts.split(SEPARATOR) if isinstance(texts, str) else list(texts)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    if prepend_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                   chat_template=CHAT_TEMPLATE)


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> Any:
    """A transformers config of `family` at toy size: hidden 64, 2 layers, 4 heads, 2 KV heads
    (grouped-query attention), head_dim 16, MLP 128, 512 positions (llama3: Llama 3's RoPE
    scaling and widths, FAMILY_EXTRAS); embeddings tied for llama, llama3, qwen2, gemma2, untied
    for phi3, mistral (transformers' defaults for the rest)."""
    import transformers

    classes = {"llama": "LlamaConfig", "llama3": "LlamaConfig", "qwen2": "Qwen2Config",
               "gemma2": "Gemma2Config", "phi3": "Phi3Config", "mistral": "MistralConfig"}
    if family not in classes:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    settings = {**TINY, "vocab_size": vocab_size, "tie_word_embeddings": TIED[family],
                **FAMILY_EXTRAS.get(family, {}), **overrides}
    return getattr(transformers, classes[family])(**settings)


def random_lm(tokenizer: Any, family: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised tiny causal LM of `family` sized to `tokenizer`'s vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, len(tokenizer), **overrides)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def train_tiny_lm(tokenizer: Any, texts: str | list[str], family: str = "llama",
                  steps: int = STEPS, seed: int = 0, batch: int = BATCH,
                  sequence: int = SEQUENCE) -> Any:
    """`random_lm` trained with AdamW (warm-up, cosine decay) on random `sequence`-token
    windows of `texts`, each starting with BOS as TextData's windows do. Runs on the CPUs that
    are free (`free_cpus`); torch's thread count is restored afterwards."""
    import torch

    text = texts if isinstance(texts, str) else SEPARATOR.join(texts)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    bos = bos_token_id(tokenizer)
    body = sequence - (bos is not None)
    threads = torch.get_num_threads()
    torch.set_num_threads(free_cpus())
    try:
        model = random_lm(tokenizer, family, seed).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01,
                                      betas=(0.9, 0.95))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
            1.0, (step + 1) / WARMUP) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))))
        generator = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - body, (batch,), generator=generator)
            windows = torch.stack([ids[start:start + body] for start in starts])
            if bos is not None:
                windows = torch.cat([torch.full((batch, 1), bos), windows], dim=1)
            loss = model(input_ids=windows, labels=windows).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def free_cpus() -> int:
    """CPUs this process may use, less those other processes keep busy (1-minute load average,
    this process not counted): on a shared, loaded machine two torch threads that wait for each
    other were measured 5x slower than one."""
    cpus = len(os.sched_getaffinity(0))
    busy = max(0, round(os.getloadavg()[0]) - 1)
    return max(1, cpus - busy)


def save_hf_folder(model: Any, tokenizer: Any, path: Path | str) -> Path:
    """`model` and `tokenizer` saved as a Hugging Face folder: config.json, generation_config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


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
