"""The gguf case's llama.cpp work, one step per fresh process (python -m bench.llm_gguf STEP
...); the last stdout line is the step's JSON result.

- anchors HF OUT: the float model's torch perplexity on TextData's default evaluation windows
  (tests/support/tiny_lm.perplexity, as the llm case computes it), and the float HF folder
  written as the .gguf files llama.cpp's own tools make, by compressor's GGUF writer (llama.cpp's
  names, metadata and tokenizer) fed the `gguf` package's reference quantizers
  (gguf.quants.quantize: llama.cpp's Q4_0 / Q8_0 rounding, bit for bit;
  tests/support/gguf_writer.py): q4_0 (every matrix, the token table too), q4_0_q8_table (the
  token embedding / head at Q8_0), q8_0 and f16 (the float model in llama.cpp). Norms and biases
  F32, as llama.cpp keeps them.
- score HF LABEL=FILE...: every file run in llama.cpp by the same code, in one process:
  LlamaCppLm(file, threads=1).predict on TextData's default evaluation windows (what `compress
  --data text` validates on), perplexity = exp(-mean token log-probability), the file's bytes,
  its tensors' ggml types, and the top-1 agreement with the `f16` file's next tokens.
- speed A B [ROUNDS]: LlamaCppLm.speed(PREFILL, DECODE) at 1 thread of two files, alternating
  A, B, A, B, ... (the machine is shared: load falls on both alike), the best round of each.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from bench.llm_models import REPO, torch_perplexity

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing here downloads

# label -> (type of the decoder's matrices, type of the token embedding / head)
ANCHORS = {"q4_0": ("Q4_0", "Q4_0"), "q4_0_q8_table": ("Q4_0", "Q8_0"),
           "q8_0": ("Q8_0", "Q8_0"), "f16": ("F16", "F16")}
REFERENCE = "f16"              # the file whose next tokens the others' top-1 agreement is with
PREFILL, DECODE, ROUNDS = 128, 64, 3


def anchors(hf: str, out: str) -> dict:
    """The float model's torch perplexity and the ANCHORS files of `hf` in `out` (see the
    module): {"torch_perplexity", "files": label -> path, bytes, seconds}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO / "tests"))   # tests/support: the reference-quantizer writer
    from support.gguf_writer import write_gguf

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf)
    Path(out).mkdir(parents=True, exist_ok=True)
    written = {}
    for label, (linear, table) in ANCHORS.items():
        started = time.perf_counter()
        path = write_gguf(model, tokenizer, Path(out) / f"{label}.gguf", linear=linear,
                          embedding=table, name=Path(hf).name)
        written[label] = {"path": str(path), "size_bytes": path.stat().st_size,
                          "seconds": round(time.perf_counter() - started, 1)}
    return {"torch_perplexity": torch_perplexity(model, tokenizer), "files": written}


def score(hf: str, *pairs: str) -> dict:
    """score HF LABEL=FILE...: each file's llama.cpp perplexity, bytes, tensor types and
    top-1 agreement with the REFERENCE file (see the module)."""
    import numpy as np
    from transformers import AutoTokenizer

    import compressor.tasks.lm.metrics as lm_metrics
    from compressor.runtimes.llamacpp import LlamaCppLm
    from compressor.tasks.lm.text_data import TextData

    _, evaluation = TextData().windows(AutoTokenizer.from_pretrained(hf))
    files = dict(pair.split("=", 1) for pair in pairs)
    rows, tops = {}, {}
    for label, path in files.items():
        started = time.perf_counter()
        outputs = LlamaCppLm(Path(path), threads=1).predict(evaluation)
        tops[label] = outputs["next_token"][:, :-1]   # the last position predicts past the window
        rows[label] = {"path": path, "perplexity": round(lm_metrics.perplexity(outputs), 4),
                       "size_bytes": Path(path).stat().st_size, "tensor_types": tensor_types(path),
                       "seconds": round(time.perf_counter() - started, 1)}
    if REFERENCE in tops:
        for label, row in rows.items():
            row["top1_vs_f16"] = round(float(np.mean(tops[label] == tops[REFERENCE])), 4)
    return {"eval_windows": list(evaluation.shape), "files": rows}


def tensor_types(path: str) -> dict:
    """How many of the file's tensors are stored in each ggml type."""
    import gguf

    reader = gguf.GGUFReader(path)
    return dict(Counter(t.tensor_type.name for t in reader.tensors))


def speed(first: str, second: str, rounds: str = str(ROUNDS)) -> dict:
    """Decode (and prefill) speed of two files at 1 thread, alternating, best round of each."""
    from compressor.runtimes.llamacpp import LlamaCppLm

    runs = {first: [], second: []}
    for _ in range(int(rounds)):
        for path in (first, second):
            runs[path].append(LlamaCppLm(Path(path), threads=1).speed(PREFILL, DECODE))
    best = {path: max(speeds, key=lambda s: s["decode_tokens_per_s"])
            for path, speeds in runs.items()}
    return {"prefill_tokens": PREFILL, "decode_tokens": DECODE, "rounds": int(rounds),
            "threads": 1, "files": {path: {
                "decode_tokens_per_s": best[path]["decode_tokens_per_s"],
                "prefill_ms": best[path].get("prefill_ms"),
                "all_decode_tokens_per_s": [s["decode_tokens_per_s"] for s in runs[path]]}
                for path in runs}}


STEPS = {"anchors": anchors, "score": score, "speed": speed}


def main(argv: list[str]) -> int:
    print(json.dumps(STEPS[argv[0]](*argv[1:]), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
