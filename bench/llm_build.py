"""The LLM case's framework work, one step per fresh process (python -m bench.llm_build STEP
...); the last stdout line is the step's JSON result.

- train OUT [--quick]: a byte-level BPE tokenizer and a small Llama (tests/support/tiny_lm.py,
  at the bench's size below) trained on the built-in corpus's calibration text, saved as a
  Hugging Face folder; its torch perplexity on TextData's default evaluation windows. Cached
  in OUT while its settings are unchanged (as are qwen's and real's).
- qwen OUT [--quick], real OUT, q4_0 HF: the other quality models and the llama.cpp-style
  Q4_0 baseline (bench/llm_models.py).
- score HF [--rounds=N] FOLDER... [--untimed FOLDER...]: every onnxruntime-genai folder scored
  by the same code, in one process: perplexity from open_lm_runtime(folder, threads=1).predict
  on every held-out window (bench/llm_closeness.py), the KL of its logits from the float
  model's there, size on disk (inspect_artifact), the 4-bit share of its weight bytes, and,
  for the folders before --untimed, speed(512, 64) at 1 thread, round-robin over them (N
  times, default ROUNDS, the median kept: the machine is shared).
- big OUT [--quick]: a ~1B-parameter random-init Llama (Llama-3.2-1B's shape) saved in
  bfloat16 with a tokenizer, for the compress peak-RSS measurement.
- mid OUT [--quick]: a random-init Llama of SmolLM-135M's shape in bfloat16, for decode speed
  where the weights do not fit the CPU's caches (the small trained LM's do).
- speed FOLDER PREFILL DECODE: one folder's speed at 1 thread (the 1B int4 artifact).
- plan HF CONTEXT: the `host` plan's decode bounds at int4 and fp32 (compressor.plan) at the
  context the speed was measured at.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench import llm_models
from bench.llm_models import cached_build, stamp_build, tiny_lm_module, shares

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing here downloads

# The bench's small LM: tiny_lm's Llama at 4x its parameter count per layer, twice the layers.
SMALL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, intermediate_size=384)
SMALL_VOCAB, SMALL_STEPS = 1024, 400
QUICK = dict(SMALL, num_hidden_layers=2, intermediate_size=256)   # --quick: development only
QUICK_VOCAB, QUICK_STEPS = 512, 150
# Llama-3.2-1B's shape (tied embeddings, 32 heads / 8 KV heads), a 32000-token vocabulary.
BIG = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
           head_dim=64, intermediate_size=8192, vocab_size=32000, max_position_embeddings=2048,
           tie_word_embeddings=True)
BIG_QUICK = dict(BIG, num_hidden_layers=2)   # --quick: ~0.2B, the same code path
# SmolLM-135M's shape (tied, 9 heads / 3 KV heads, hidden 576): float32 weights 0.54 GB, far
# past this CPU's 32 MB L3, as a real checkpoint's are on a board.
MID = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
           head_dim=64, intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048,
           tie_word_embeddings=True)
MID_QUICK = dict(MID, num_hidden_layers=4)
SPEED = {"prefill_tokens": 512, "decode_tokens": 64}
ROUNDS = 3


def train(out: str, quick: bool = False) -> dict:
    """The small LM: tiny_lm's tokenizer and training run at the bench's size (tiny_lm.TINY is
    the config every tiny model starts from; this fresh process widens it)."""
    from compressor.tasks.lm.text_data import TextData

    tiny_lm = tiny_lm_module()
    size, vocab, steps = (QUICK, QUICK_VOCAB, QUICK_STEPS) if quick else (SMALL, SMALL_VOCAB,
                                                                         SMALL_STEPS)
    key = {"family": "llama", **size, "vocab": vocab, "steps": steps}
    if (saved := cached_build(Path(out), key)):
        return {**saved, "cached": True}
    tiny_lm.TINY = {**tiny_lm.TINY, **size}
    calibration_text, _ = tiny_lm.builtin_texts()
    started = time.perf_counter()
    tokenizer = tiny_lm.train_tokenizer(calibration_text, vocab_size=vocab)
    model = tiny_lm.train_tiny_lm(tokenizer, calibration_text, family="llama", steps=steps)
    train_s = time.perf_counter() - started
    folder = tiny_lm.save_hf_folder(model, tokenizer, Path(out))
    _, evaluation = TextData().windows(tokenizer)
    return stamp_build(Path(out), key, {
        "hf": str(folder), "family": "llama",
        "config": {**size, "vocab_size": len(tokenizer), "steps": steps},
        **shares(model), "train_s": round(train_s, 1),
        "torch_perplexity": round(tiny_lm.perplexity(model, evaluation), 4),
        "eval_windows": list(evaluation.shape)})


def score(hf: str, *args: str) -> dict:
    """score HF [--rounds=N] TIMED_FOLDER... [--untimed FOLDER...]: every folder's perplexity,
    size and int4 share; the timed ones' speed too, N (default ROUNDS) round-robin rounds."""
    rounds = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--rounds=")), ROUNDS)
    args = [a for a in args if not a.startswith("--rounds=")]
    cut = args.index("--untimed") if "--untimed" in args else len(args)
    return _score(hf, args[:cut], args[cut + 1:], rounds)


def _score(hf: str, timed: list[str], untimed: list[str], rounds: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import compressor.tasks.lm.metrics as lm_metrics
    from bench.llm_closeness import held_out, kl_from_logits
    from compressor.backends.llm.candidates import KlScorer
    from compressor.runtimes import inspect_artifact
    from compressor.runtimes.lm import open_lm_runtime
    from compressor.runtimes.weights import weight_share_at

    torch.set_num_threads(1)
    evaluation = held_out(AutoTokenizer.from_pretrained(hf))
    reference = KlScorer(AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval(),
                         evaluation)
    folders = [*timed, *untimed]
    rows = {}
    for folder in folders:
        info = inspect_artifact(Path(folder))
        runtime = open_lm_runtime(Path(folder), threads=1)
        outputs = runtime.predict(evaluation)
        rows[folder] = {"perplexity": round(lm_metrics.perplexity(outputs), 4),
                        "kl": kl_from_logits(reference, runtime.logits),
                        "size_bytes": info.size_bytes, **_layout_bytes(Path(folder)),
                        "int4_share": round(weight_share_at(info.weights, 4)[0], 4),
                        "speeds": []}
    for _ in range(rounds):   # round-robin: the machine's load falls on every folder alike
        for folder in timed:
            rows[folder]["speeds"].append(open_lm_runtime(Path(folder), threads=1).speed(**SPEED))
    for row in rows.values():
        if not row["speeds"]:
            row.pop("speeds")
            continue
        for key in ("decode_tokens_per_s", "prefill_ms", "peak_rss_bytes"):
            row[key] = statistics.median(s[key] for s in row["speeds"])
        row["threads"] = row["speeds"][0]["threads"]
        row["prefill_tokens"] = row["speeds"][0]["prefill_tokens"]   # capped to the context
    return {"eval_windows": list(evaluation.shape), "rounds": rounds,
            **(SPEED if rounds else {}), "folders": rows}


def _layout_bytes(folder: Path) -> dict:
    """Where a folder's bytes go: the graph (model.onnx) and the int4 zero points (a uint8
    tensor per MatMulNBits that has one; symmetric int4 has none)."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    zero_points = {node.input[3] for node in model.graph.node
                   if node.op_type == "MatMulNBits" and len(node.input) > 3 and node.input[3]}
    sizes = {t.name: sum(int(e.value) for e in t.external_data if e.key == "length")
             or len(t.raw_data) for t in model.graph.initializer}
    return {"graph_bytes": (folder / "model.onnx").stat().st_size,
            "zero_point_bytes": sum(sizes.get(name, 0) for name in zero_points)}


def big(out: str, quick: bool = False) -> dict:
    return _random_llama(out, BIG_QUICK if quick else BIG)


def mid(out: str, quick: bool = False) -> dict:
    return _random_llama(out, MID_QUICK if quick else MID)


def _random_llama(out: str, shape: dict) -> dict:
    """A random-init Llama in bfloat16 (initialised in bf16: no float32 copy is ever made),
    saved with save_pretrained and the small tokenizer (its ids are a subset of the vocabulary)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tiny_lm = tiny_lm_module()
    started = time.perf_counter()
    torch.manual_seed(0)
    config = LlamaConfig(**shape, bos_token_id=tiny_lm.BOS_ID,
                         eos_token_id=tiny_lm.EOS_ID, pad_token_id=tiny_lm.PAD_ID)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    tokenizer = tiny_lm.train_tokenizer(tiny_lm.builtin_texts()[0], vocab_size=SMALL_VOCAB)
    folder = tiny_lm.save_hf_folder(model, tokenizer, Path(out))
    checkpoint = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return {"hf": str(folder), "params": sum(p.numel() for p in model.parameters()),
            "checkpoint_bytes": checkpoint, "config": {k: v for k, v in config.to_dict().items()
                                                      if k in shape},
            "build_s": round(time.perf_counter() - started, 1)}


def speed(folder: str, prefill: str, decode: str) -> dict:
    from compressor.runtimes.lm import open_lm_runtime

    return open_lm_runtime(Path(folder), threads=1).speed(int(prefill), int(decode))


def plan_bounds(hf: str, context: str) -> dict:
    from compressor.plan import plan

    result = plan(hf, target="host", context=int(context), recipes=["int4", "fp32"])
    return {"device": result["device"], "context": result["context"],
            "bounds": {p["recipe"]: p["decode_tokens_per_s_bound"] for p in result["plans"]},
            "weights_bytes": {p["recipe"]: p["weights_bytes"] for p in result["plans"]}}


STEPS = {"train": train, "score": score, "big": big, "mid": mid,
         "speed": speed, "plan": plan_bounds, "qwen": llm_models.qwen, "real": llm_models.real,
         "q4_0": llm_models.q4_0}
BUILDS = (train, big, mid, llm_models.qwen, llm_models.real)   # the steps that take --quick


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    args = [a for a in argv[1:] if a != "--quick"]
    step = STEPS[argv[0]]
    result = step(*args, quick=quick) if step in BUILDS else step(*args)
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
