"""The language-model half of `make demo`: train a tiny Llama on the built-in English corpus, save
it as a Hugging Face folder, then `compress plan` it, compress it with int4 and generate text
with the int4 ONNX artifact.

    python -m compressor.demo --route lm [--out demo-out]

The tiny model (compressor.backends.llm.examples, the one the tests train too): a byte-level
BPE tokenizer of 512 ids (<unk> <s> </s> <pad> as ids 0-3, a BOS prepended as Llama's does) and
a Llama of hidden 64, 2 layers, 4 heads sharing 2 KV heads (head_dim 16), MLP 128, 512
positions, tied embeddings, trained with AdamW (warm-up, cosine decay) for 400 steps on random
256-token windows of the corpus's calibration part only, so the perplexity `compress` reports on
the held-out tail is measured on text the model never saw. It reaches a held-out perplexity of
44.8 (unigram ~210, untrained ~520), where int4 stays well inside its gate (perplexity +10% at
most; measured +1.0-1.3%, ONNX and TFLite). Training takes ~40 s of one CPU core; the folder is
reused when it is already there.

No framework is imported here (the training loop lives in backends): `import compressor` and
`import compressor.demo_lm` stay framework-free.
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
    tokenizer, model, loss = _train(_calibration_text())
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


def _complete(folder: Path) -> bool:
    """Whether `folder` holds a saved model and tokenizer (the folder is then reused)."""
    return all((folder / name).is_file() for name in FOLDER_FILES)


def _calibration_text() -> str:
    """The built-in corpus's calibration part (the text before its held-out tail)."""
    from compressor.tasks.lm.text_data import TextData

    return TextData().texts()[0]


def _train(calibration: str) -> tuple[Any, Any, float]:
    """(tokenizer, model, last training loss) of the tiny Llama trained on `calibration`."""
    from compressor.backends.llm import examples
    from compressor.backends.torch.threads import free_cpus
    from compressor.tasks.lm.text_data import SEPARATOR, bos_token_id

    tokenizer = examples.train_tokenizer(calibration.split(SEPARATOR))
    losses: list[float] = []

    def progress(step: int, loss: float) -> None:
        losses.append(loss)
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1}/{examples.STEPS}: loss {loss:.2f}", file=sys.stderr,
                  flush=True)

    print(f"  {free_cpus()} torch thread(s), {examples.STEPS} AdamW steps of "
          f"{examples.BATCH} x {examples.SEQUENCE} tokens", file=sys.stderr, flush=True)
    model = examples.train_causal_lm(lambda: examples.tiny_llama(tokenizer), tokenizer,
                                     calibration, bos_token_id(tokenizer), on_step=progress)
    return tokenizer, model, losses[-1]


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds:.2f} s"


def _quoted(part: str) -> str:
    return f'"{part}"' if " " in part else part
