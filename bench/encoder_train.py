"""The transformer case's trained sentence encoder (bench/transformer_build.py builds it).

A Hugging Face BertModel from a BertConfig (nothing downloaded), mean-pooled and L2-normalised
as MiniLM-style sentence encoders are, trained in the bench on real English text: the
docstrings of Python's standard library (no download; word-level vocabulary of its most common
VOCAB - 5 tokens). Two losses on windows of SEQ tokens starting with [CLS]: masked-language
modelling (15% of tokens masked) and a contrastive sentence-embedding loss (two differently
masked views of a window must find each other among the batch), which spreads the embeddings
out the way a sentence encoder's are, instead of leaving them all near one direction.

Pretrained BERTs carry a few residual channels far larger than the rest (outlier dimensions:
LayerNorm gains and activations tens of times the median channel), which dynamic int8 must
cope with; they emerge only after far longer pretraining than a bench can afford. So the two
channels OUTLIER_CHANNELS start with a gain of OUTLIER_GAIN in every LayerNorm but the last,
and the model trains with them: its LayerNorm outputs end tens to hundreds of times their
median channel (results.json records each LayerNorm's ratio).
"""
from __future__ import annotations

import ast
import collections
import re
import sysconfig
from pathlib import Path

import numpy as np

SEQ, VOCAB, PAD, UNK, CLS, SEP, MASK = 32, 4096, 0, 1, 2, 3, 4
CONFIG = {"vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "intermediate_size": 512, "max_position_embeddings": 64,
          "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
STEPS, BATCH, LR, WARMUP, MASKED, TEMPERATURE = 500, 32, 5e-4, 100, 0.15, 0.05
OUTLIER_CHANNELS, OUTLIER_GAIN = (7, 77), 10.0


def stdlib_docstrings() -> list[str]:
    """Every module / class / function docstring of the standard library (tests, idlelib and
    site-packages left out), in file order: the bench's text that needs no download."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "idlelib", "site-packages"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue   # a file this Python cannot parse is simply not part of the corpus
        docs += [doc for node in ast.walk(tree) if isinstance(
            node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            if (doc := ast.get_docstring(node))]
    return docs


def token_stream() -> np.ndarray:
    """The standard library's docstrings as one stream of word ids, [SEP] between them."""
    docs = stdlib_docstrings()
    words = [re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", doc.lower()) for doc in docs if doc]
    counts = collections.Counter(word for doc in words for word in doc)
    index = {word: i + 5 for i, (word, _) in enumerate(counts.most_common(VOCAB - 5))}
    return np.array([i for doc in words for i in [index.get(w, UNK) for w in doc] + [SEP]],
                    np.int64)


def windows(stream: np.ndarray, rows: int, seed: int, padded_tail: int = 0) -> dict:
    """`rows` windows ([CLS] + SEQ - 1 tokens) at seeded random places; the last `padded_tail`
    positions of each row randomly padded (attention_mask 0, id [PAD])."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - SEQ, rows)
    ids = np.stack([np.concatenate([[CLS], stream[s:s + SEQ - 1]]) for s in starts])
    mask = np.ones_like(ids)
    if padded_tail:
        mask[:, SEQ - padded_tail:] = rng.integers(0, 2, (rows, padded_tail))
    return {"input_ids": np.where(mask == 1, ids, PAD).astype(np.int64),
            "attention_mask": mask.astype(np.int64)}


def sentence_encoder(bert):
    """`bert` mean-pooled over its attention mask and L2-normalised: one embedding per row (the
    artifacts' one output, named `output`)."""
    import torch

    class SentenceEncoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids,
                               attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return SentenceEncoder(bert).eval()


def trained_encoder(stream: np.ndarray):
    """(the trained sentence encoder, what its training reached)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**CONFIG))
    last = model.bert.encoder.layer[-1].output.LayerNorm
    with torch.no_grad():
        for norm in model.bert.modules():
            if isinstance(norm, torch.nn.LayerNorm) and norm is not last:
                norm.weight[list(OUTLIER_CHANNELS)] = OUTLIER_GAIN
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / WARMUP, max(0.05, 1 - step / STEPS)))
    model.train()
    for step in range(STEPS):
        ids = torch.from_numpy(windows(stream, BATCH, 1000 + step)["input_ids"])
        views, states = [], []
        for _ in range(2):
            masked = torch.rand(ids.shape) < MASKED
            masked[:, 0] = False
            views.append(masked)
            states.append(model.bert(input_ids=ids.masked_fill(masked, MASK)).last_hidden_state)
        mlm = torch.nn.functional.cross_entropy(model.cls(states[0][views[0]]), ids[views[0]])
        a, b = (torch.nn.functional.normalize(s.mean(1), dim=-1) for s in states)
        similarity, match = a @ b.T / TEMPERATURE, torch.arange(BATCH)
        contrastive = (torch.nn.functional.cross_entropy(similarity, match)
                       + torch.nn.functional.cross_entropy(similarity.T, match)) / 2
        optimizer.zero_grad()
        (mlm + contrastive).backward()
        optimizer.step()
        schedule.step()
    return sentence_encoder(model.bert), {"steps": STEPS, "mlm_loss": round(mlm.item(), 3),
                                          "contrastive_loss": round(contrastive.item(), 3)}


def outlier_ratios(encoder, inputs: dict) -> list[float]:
    """Per LayerNorm of the encoder, in order: its largest channel peak (max |value| over the
    inputs' tokens) / its median channel peak."""
    import torch

    ratios, hooks = [], []

    def record(module, args, output):
        peak = output.detach().abs().amax(dim=(0, 1))
        ratios.append(round(float(peak.max() / peak.median()), 1))

    for module in encoder.modules():
        if isinstance(module, torch.nn.LayerNorm):
            hooks.append(module.register_forward_hook(record))
    with torch.no_grad():
        encoder(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    for hook in hooks:
        hook.remove()
    return ratios
