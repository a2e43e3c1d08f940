"""What the LLM case scores every model and artifact on, and how close each is to its float model.

- held_out(tokenizer): every window of TextData's default length the built-in corpus's held-out
  part holds (35 / 30 / 22 for the bench's three tokenizers), not compress's default 16. At
  16 windows the int4 perplexity increases of the bench's small models (+0.1-0.6%) had a
  per-window standard error of ~0.2% each, and their ratio to Q4_0's one of ~0.4: the
  `int4_vs_q4_0` verdict moved with the windows (small Llama 0.52 on 16, 0.24 on all 35;
  Qwen2 0.15 on 16, 0.86 on all 30).
- kl_from_logits(reference, logits): the mean KL(float || artifact) per predicted token, by
  the KL compress scores its own candidates with (backends/llm/candidates.KlScorer), of any
  logits: an artifact's in its runtime, a torch copy's. How far the artifact's next-token
  distribution is from the float model's, whatever token the text has next; its standard
  error is ~1-2% of its value on these windows, where a perplexity increase's is ~50%: it
  resolves what the perplexity ratios cannot.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

# numpy and torch are imported where used: the bench's parent process (bench.run, which
# reads EVERY_WINDOW through case_llm) imports no framework
EVERY_WINDOW = 4096   # more than any held-out part holds: TextData cuts every window that fits


def held_out(tokenizer: Any) -> Any:
    """int64 [N, 256]: every evaluation window of the built-in text for `tokenizer`."""
    from compressor.tasks.lm.text_data import TextData

    _, evaluation = TextData(eval_windows=EVERY_WINDOW).windows(tokenizer)
    return evaluation


def kl_from_logits(reference: Any, logits: Callable[[Any], Any]) -> float:
    """`reference` (a KlScorer of the float model on the windows) against `logits(windows
    int64 [B, T] numpy)`: float [B, T, vocab] (numpy or torch), to 6 decimals."""
    import numpy as np
    import torch

    def log_q(batch: torch.Tensor) -> torch.Tensor:
        got = logits(batch.numpy())
        got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got))
        return torch.log_softmax(got.float(), dim=-1)

    return round(reference.kl(log_q), 6)
