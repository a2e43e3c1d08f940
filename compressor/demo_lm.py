"""The language-model half of `make demo`: train a tiny Llama on the built-in English corpus, save
it as a Hugging Face folder, then `compress plan` it, compress it with int4 and generate text
with the int4 ONNX artifact.

    python -m compressor.demo --route lm [--out demo-out]

The tiny model: a byte-level BPE tokenizer of 512 ids (<unk> <s> </s> <pad> as ids 0-3, a BOS
prepended as Llama's does) and a Llama of hidden 64, 2 layers, 4 heads sharing 2 KV heads
(head_dim 16), MLP 128, 512 positions, tied embeddings, trained with AdamW (warm-up, cosine
decay) on random 256-token windows of the corpus's calibration part only, so the perplexity
`compress` reports on the held-out tail is measured on text the model never saw. 400 steps
reach a held-out perplexity of 44.8 (unigram ~210, untrained ~520), where int4 stays well inside
its gate (perplexity +10% at most; measured +1.0-1.3%, ONNX and TFLite). The folder is reused
when it is already there; 45 s to train on one free core.

torch / transformers / tokenizers are imported inside the functions: `import compressor` stays
framework-free.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LM_FOLDER = "tiny-llama"
TARGET = "jetson-orin-nx-8gb"
RECIPE = "int4"
PROMPT = "The Wolf said to the Lamb,"
NEW_TOKENS = 24
CONTEXT = 512   # the tiny model's max_position_embeddings
VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")   # ids 0, 1, 2, 3
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, max_position_embeddings=CONTEXT,
            tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
            pad_token_id=PAD_ID)
STEPS, BATCH, SEQUENCE, LEARNING_RATE, WARMUP, SEED = 400, 8, 256, 4e-3, 30, 0
# what a saved folder must hold to be reused
FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def run(out: Path) -> int:
    """The LM route into `out`: 0 when every stage passed, else the failing stage's exit code."""
    os.environ["HF_HUB_OFFLINE"] = "1"   # nothing here downloads
    from compressor.cli import main as compress_main

    folder = out / LM_FOLDER
    int4_out = out / RECIPE
    timings: list[tuple[str, float]] = []

    def stage(name: str, action: Callable[[], int]) -> int:
        began = time.perf_counter()
        code = action()
        timings.append((name, time.perf_counter() - began))
        if code != 0:
            print(f"demo: the {name} stage failed (exit {code})", file=sys.stderr)
        return code

    def cli(command: list[str]) -> Callable[[], int]:
        def call() -> int:
            print(f"\n$ compress {' '.join(_quoted(part) for part in command)}", file=sys.stderr,
                  flush=True)
            code = compress_main(command)
            sys.stdout.flush()
            return code
        return call

    began = time.perf_counter()
    stages = (
        ("train (reused)" if _complete(folder) else "train", lambda: _trained_folder(folder)),
        # plan's default context (4096) is beyond the tiny model's 512 positions
        ("plan", cli(["plan", str(folder), "--target", TARGET, "--context", str(CONTEXT)])),
        (RECIPE, cli(["--recipe", RECIPE, str(folder), "--data", "text",
                      "--out", str(int4_out), "--force"])),
        ("generate", cli(["generate", str(int4_out / "model-onnx"), "--prompt", PROMPT,
                          "--max-new-tokens", str(NEW_TOKENS)])),
    )
    code = 0
    for name, action in stages:
        code = stage(name, action)
        if code != 0:
            break
    total = time.perf_counter() - began
    shown = ", ".join(f"{name} {_seconds(seconds)}" for name, seconds in timings)
    print(f"\nlm route timings: {shown}, total {_seconds(total)}", file=sys.stderr)
    return code


def _trained_folder(folder: Path) -> int:
    """Train the tiny LM and save it to `folder`, unless a complete folder is already there."""
    if _complete(folder):
        print(f"reusing the tiny language model in {folder}", file=sys.stderr)
        return 0
    print(f"training a tiny Llama on the built-in English corpus -> {folder}",
          file=sys.stderr, flush=True)
    calibration = _calibration_text()
    tokenizer = train_tokenizer(calibration)
    model, loss = train_lm(tokenizer, calibration)
    print(f"trained: last loss {loss:.2f} (perplexity {math.exp(loss):.0f} on its training "
          f"windows; vocabulary {len(tokenizer)})", file=sys.stderr)
    # saved next to the final place first, so an interrupted run never leaves a folder to reuse
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return 0


def _text_data() -> Any:
    """The corpus / text-window module (TextData, SEPARATOR, bos_token_id): its one import here."""
    # TODO(restructure): compressor.llm.text_data is moving (to compressor.tasks.lm.text_data)
    from compressor.llm import text_data

    return text_data


def _complete(folder: Path) -> bool:
    """Whether `folder` holds a saved model and tokenizer (the folder is then reused)."""
    return all((folder / name).is_file() for name in FOLDER_FILES)


def _calibration_text() -> str:
    """The built-in corpus's calibration part (the text before its held-out tail)."""
    return _text_data().TextData().texts()[0]


def train_tokenizer(text: str, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE PreTrainedTokenizerFast trained on `text`'s paragraphs: <unk> <s> </s>
    <pad> as ids 0-3, a BOS prepended to encoded text as Llama's does, a small chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(text.split(_text_data().SEPARATOR), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   chat_template=CHAT_TEMPLATE)


def train_lm(tokenizer: Any, text: str, steps: int = STEPS) -> tuple[Any, float]:
    """(a tiny Llama trained with AdamW on random SEQUENCE-token windows of `text`, each starting
    with BOS as TextData's windows do; its last training loss). Runs on the CPUs that are
    available (`available_cpus`); torch's thread count is restored afterwards."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    bos = _text_data().bos_token_id(tokenizer)
    body = SEQUENCE - (bos is not None)
    threads = torch.get_num_threads()
    torch.set_num_threads(available_cpus())
    print(f"  {torch.get_num_threads()} torch thread(s), {steps} AdamW steps of {BATCH} x "
          f"{SEQUENCE} tokens", file=sys.stderr, flush=True)
    try:
        torch.manual_seed(SEED)
        config = LlamaConfig(vocab_size=len(tokenizer), **TINY)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01,
                                      betas=(0.9, 0.95))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
            1.0, (step + 1) / WARMUP) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))))
        generator = torch.Generator().manual_seed(SEED)
        loss = torch.tensor(float("nan"))
        for step in range(steps):
            starts = torch.randint(0, len(ids) - body, (BATCH,), generator=generator)
            windows = torch.stack([ids[start:start + body] for start in starts])
            if bos is not None:
                windows = torch.cat([torch.full((BATCH, 1), bos), windows], dim=1)
            loss = model(input_ids=windows, labels=windows).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if (step + 1) % 100 == 0:
                print(f"  step {step + 1}/{steps}: loss {loss.item():.2f}", file=sys.stderr,
                      flush=True)
    finally:
        torch.set_num_threads(threads)
    return model.eval(), loss.item()


def available_cpus() -> int:
    """CPUs this process may use, less those other processes keep busy (1-minute load average,
    this process not counted). On a 2-core machine with another process busy, 60 training steps
    took 9-10 s on one torch thread and 34-35 s on two threads waiting for each other."""
    cpus = len(os.sched_getaffinity(0))
    busy = max(0, round(os.getloadavg()[0]) - 1)
    return max(1, cpus - busy)


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds:.2f} s"


def _quoted(part: str) -> str:
    return f'"{part}"' if " " in part else part
