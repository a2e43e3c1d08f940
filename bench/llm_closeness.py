"""What the LLM case scores every model and artifact on, and how close each is to its float model.

- held_out(tokenizer): every window of TextData's default length the built-in corpus's held-out
  part holds (35 / 30 / 22 for the bench's three tokenizers), not compress's default 16. At
  16 windows the int4 perplexity increases of the bench's small models (+0.1-0.6%) had a
  per-window standard error of ~0.2% each, and their ratio to Q4_0's one of ~0.4: the
  `int4_vs_q4_0` verdict moved with the windows (small Llama 0.52 on 16, 0.24 on all 35;
  Qwen2 0.15 on 16, 0.86 on all 30).
- FloatReference(model, windows).kl(logits): the mean KL(float || artifact) per predicted token
  (sum p (log p - log q) over the vocabulary): how far the artifact's next-token distribution
  is from the float model's, whatever token the text has next. Its standard error is ~1-2% of
  its value on these windows, where a perplexity increase's is ~50%: it resolves what the
  perplexity ratios cannot.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

# numpy and torch are imported where used: the bench's parent process (bench.run, which
# reads EVERY_WINDOW through case_llm) imports no framework
EVERY_WINDOW = 4096   # more than any held-out part holds: TextData cuts every window that fits
BATCH = 4


def held_out(tokenizer: Any) -> Any:
    """int64 [N, 256]: every evaluation window of the built-in text for `tokenizer`."""
    from compressor.tasks.lm.text_data import TextData

    _, evaluation = TextData(eval_windows=EVERY_WINDOW).windows(tokenizer)
    return evaluation


class FloatReference:
    """The float model's next-token distributions on `windows`, kept batch by batch as
    (p float16, sum p log p) to score any artifact's logits against."""

    def __init__(self, model: Any, windows: Any):
        import numpy as np
        import torch

        self.windows = windows
        self.batches = []
        with torch.inference_mode():
            for start in range(0, len(windows), BATCH):
                ids = torch.from_numpy(np.asarray(windows[start:start + BATCH], np.int64))
                log_p = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
                p = log_p.exp()
                self.batches.append((p.to(torch.float16), float((p * log_p).sum())))

    def kl(self, logits: Callable[[Any], Any]) -> float:
        """Mean KL(float || X) per position; `logits(windows [B, T])`: X's [B, T, vocab]."""
        import numpy as np
        import torch

        total, tokens = 0.0, 0
        with torch.inference_mode():
            for index, (p, p_log_p) in enumerate(self.batches):
                batch = np.ascontiguousarray(self.windows[index * BATCH:(index + 1) * BATCH])
                got = logits(batch)
                got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got))
                log_q = torch.log_softmax(got.float(), dim=-1)
                total += p_log_p - float((p.float() * log_q).sum())
                tokens += batch.shape[0] * batch.shape[1]
        return round(total / tokens, 6)
