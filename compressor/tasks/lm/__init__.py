"""The causal language-model task: text windows, perplexity, agreement and generation speed."""
