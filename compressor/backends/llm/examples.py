"""A small causal LM trained on text, for `make demo` and the tests: a byte-level BPE tokenizer
trained on the text, a Llama-family model from a config, and a short AdamW run on random
windows of the text (warm-up, cosine decay), each starting with BOS as TextData's windows do.
torch / transformers / tokenizers are imported inside the functions.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compressor.backends.torch.threads import on_free_cpus

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")   # ids 0, 1, 2, 3 in every trained tokenizer
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# hidden 64, 2 layers, 4 query heads sharing 2 KV heads (head_dim 16), MLP 128, 512 positions
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=512, head_dim=16,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
# 400 steps of 8 x 256 tokens take ~41 s of one CPU core (about 25 s on two) and reach a
# held-out perplexity near 45-48 on the built-in corpus (unigram 210, untrained 520).
STEPS, BATCH, SEQUENCE, LEARNING_RATE, WARMUP = 400, 8, 256, 4e-3, 30


def train_tokenizer(texts: list[str], vocab_size: int = 512, prepend_bos: bool = True) -> Any:
    """A byte-level BPE PreTrainedTokenizerFast trained on `texts`: <unk> <s> </s> <pad> as ids
    0-3, a BOS prepended to encoded text as Llama's does (`prepend_bos=False`: none, as Qwen2's),
    and a small chat template. onnxruntime-genai opens the saved files and encodes the same ids,
    without the BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(list(texts), trainer)
    if prepend_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                   chat_template=CHAT_TEMPLATE)


def tiny_llama(tokenizer: Any, seed: int = 0, tie_word_embeddings: bool = True) -> Any:
    """A randomly initialised Llama of TINY's size for `tokenizer`'s vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(**TINY, vocab_size=len(tokenizer), tie_word_embeddings=tie_word_embeddings)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def train_causal_lm(build: Callable[[], Any], tokenizer: Any, text: str, bos: int | None,
                    steps: int = STEPS, seed: int = 0, batch: int = BATCH,
                    sequence: int = SEQUENCE,
                    on_step: Callable[[int, float], bool | None] | None = None,
                    lr: float = LEARNING_RATE, weight_decay: float = 0.01,
                    warmup: int = WARMUP) -> Any:
    """The model `build()` returns, trained with AdamW (warm-up, cosine decay) on random
    `sequence`-token windows of `text`, each starting with `bos` (when not None);
    `on_step(step, loss)` after each step, which stops the training by returning True (and
    may evaluate the model: it is put back in training mode after). Runs on the CPUs that are
    free (threads.on_free_cpus); torch's thread count is restored afterwards."""
    import torch

    ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    body = sequence - (bos is not None)
    with on_free_cpus():
        model = build().train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                                      betas=(0.9, 0.95))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
            1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))))
        generator = torch.Generator().manual_seed(seed)
        for step in range(steps):
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
            if on_step is not None and on_step(step, loss.item()):
                break
            model.train()
    return model.eval()


def save_hf_folder(model: Any, tokenizer: Any, path: Path | str) -> Path:
    """`model` and `tokenizer` saved as a Hugging Face folder: config.json, generation_config.json,
    model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
