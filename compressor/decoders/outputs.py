"""The teacher-forced outputs of a language model on token windows [N, T], the same for torch
and every runtime: `next_token` (argmax at each position, [N, T]) and `token_logprob`
(log-probability of each actual next token, [N, T-1]): enough for perplexity and agreement,
and far smaller than the [N, T, vocab] logits. `greedy`: greedy continuations of fixed prompts.
"""

NEXT_TOKEN = "next_token"
TOKEN_LOGPROB = "token_logprob"
GREEDY = "greedy"
