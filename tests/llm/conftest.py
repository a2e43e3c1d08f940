"""Tiny language models for the LLM tests, built once per session and saved as Hugging Face
folders (config.json, model.safetensors, tokenizer files) that share one tokenizer: a Llama
trained on the built-in corpus (`trained_lm_dir`, ~25-40 s) so perplexity means something, and
random-init models of each family (`random_lm_dir("qwen2")`, a second or two each)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from support import helpers, tiny_lm

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing in these tests downloads


@pytest.fixture(autouse=True)
def own_objects_only():
    """Each test's garbage collections scan only the objects it made, as a `compress` run's do
    (memory.run_objects_only): the export functions these tests call directly hand memory back
    with a full collection, 0.6 s each in a session holding TensorFlow, torch and transformers."""
    from compressor.core.memory import run_objects_only

    with run_objects_only():
        yield


@pytest.fixture(scope="session")
def lm_tokenizer():
    """The byte-level BPE tokenizer (512 ids, BOS prepended) trained on the corpus's
    calibration part; every fixture model uses it."""
    return tiny_lm.train_tokenizer(tiny_lm.builtin_texts()[0])


@pytest.fixture(scope="session")
def trained_lm_dir(tmp_path_factory, lm_tokenizer) -> Path:
    """A tiny Llama (tied embeddings, GQA) trained on the built-in corpus's calibration text
    (once per run, shared by pytest-xdist workers; the tokenizer training is deterministic)."""
    def build(path: Path) -> None:
        model = tiny_lm.train_tiny_lm(lm_tokenizer, tiny_lm.builtin_texts()[0], family="llama")
        tiny_lm.save_hf_folder(model, lm_tokenizer, path)

    return helpers.built_once(tmp_path_factory, "tiny-llama", build)


@pytest.fixture(scope="session")
def random_lm_dir(tmp_path_factory, lm_tokenizer) -> Callable[[str], Path]:
    """`random_lm_dir(family)`: the folder of a random-init tiny model of that family
    (tiny_lm.FAMILIES), built on first use."""
    built: dict[str, Path] = {}

    def folder(family: str = "llama") -> Path:
        if family not in built:
            model = tiny_lm.random_lm(lm_tokenizer, family)
            built[family] = tiny_lm.save_hf_folder(
                model, lm_tokenizer, tmp_path_factory.mktemp(f"random-{family}") / f"tiny-{family}")
        return built[family]

    return folder


@pytest.fixture(scope="session")
def bf16_lm_dir(tmp_path_factory, lm_tokenizer) -> Callable[[str], Path]:
    """`bf16_lm_dir(family)`: a random-init tiny model of that family saved in bfloat16, as
    the Hub's checkpoints are (tiny_lm.FAMILIES; "gemma3_hub": a Gemma 3 whose config.json is
    in the Hub's original form, tiny_lm.gemma3_hub_form), built on first use."""
    import torch

    built: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in built:
            base = "gemma3_text" if family == "gemma3_hub" else family
            model = tiny_lm.random_lm(lm_tokenizer, base).to(torch.bfloat16)
            path = tiny_lm.save_hf_folder(
                model, lm_tokenizer, tmp_path_factory.mktemp(f"bf16-{family}") / f"tiny-{family}")
            built[family] = tiny_lm.gemma3_hub_form(path) if family == "gemma3_hub" else path
        return built[family]

    return folder


@pytest.fixture(scope="session")
def int4_gguf_run(trained_lm_dir, tmp_path_factory):
    """`compress --recipe int4 TRAINED --format gguf` as a user runs it, once per session:
    (out folder, the CompletedProcess, report.json or None)."""
    import json

    from conftest import run_cli

    out = tmp_path_factory.mktemp("gguf-int4") / "out"
    result = run_cli("--recipe", "int4", str(trained_lm_dir), "--data", "text", "--out", str(out),
                     "--format", "gguf")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() \
        else None
    return out, result, report
