"""The causal language-model task: text windows, perplexity, agreement and generation speed
(task.py registers it)."""
from compressor.tasks.lm.task import LmTask

__all__ = ["LmTask"]
