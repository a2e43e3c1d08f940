"""A small sentence encoder for the dynamic int8 tests, as a `module:function` model reference
(`support.encoder_models:sentence_encoder`, importable with tests/ as the working folder).

A random-init Hugging Face BertModel (nothing downloaded), mean-pooled and L2-normalised as
MiniLM-style encoders are, big enough that int8 weights dominate its file (the size bound is
a fraction of fp32 bytes), and with two residual channels whose LayerNorm gain is OUTLIER_GAIN
in every LayerNorm but the last (pretrained BERTs' outlier dimensions), so both smoothed and
unsmoothed settings are tried.
"""
from __future__ import annotations

from typing import Any

import numpy as np

VOCAB, SEQ, OUTLIER_GAIN, OUTLIER_CHANNELS = 2000, 16, 30.0, (7, 77)


def sentence_encoder() -> Any:
    import torch
    from transformers import BertConfig, BertModel

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.bert = BertModel(BertConfig(
                vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=1024, max_position_embeddings=SEQ), add_pooling_layer=False)
            norms = [m for m in self.bert.modules() if isinstance(m, torch.nn.LayerNorm)]
            with torch.no_grad():   # not the last: the embedding stays one of ordinary channels
                for norm in norms[:-1]:
                    norm.weight[list(OUTLIER_CHANNELS)] = OUTLIER_GAIN

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return SentenceEncoder().eval()


def token_inputs(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Random ids, the last quarter of each row randomly padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (rows, SEQ)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, SEQ * 3 // 4:] = rng.integers(0, 2, (rows, SEQ // 4))
    return {"input_ids": ids * mask, "attention_mask": mask}
