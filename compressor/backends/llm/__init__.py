"""Causal language models (Hugging Face transformers): weight-only int4 / int8 and float16,
exported as an onnxruntime-genai folder and a LiteRT model with a KV cache.

The model is never trained or rewritten here: passes return a LoadedLm holding the integers
each linear weight is stored with (model.py), and the exporters write exactly those. Validation
reads teacher-forced next-token outputs (compressor/decoders/outputs.py) from torch and from each
artifact's runtime on held-out text windows.
"""
from __future__ import annotations

from typing import Any

import compressor.backends.llm.handlers  # noqa: F401  (fills the scheme handler table)
from compressor.backends.base import ModelInfo, SchemeExporter
from compressor.backends.llm.model import LoadedLm
from compressor.decoders.outputs import NEXT_TOKEN, TOKEN_LOGPROB
from compressor.core.tensors import Arrays, TensorSpec

PREDICT_BATCH = 4   # windows per forward pass: [4, T, vocab] float32 logits at a time


class LlmBackend(SchemeExporter):
    name = "llm"
    task = "lm"
    training_refusal = ("compressor does not fine-tune language models this way: step {number} "
                        "`{step}`{mode} trains as only classifier models are trained; language "
                        "models train in int4_qat (mode qat, dtype int4), prune with structure: "
                        "channel and distill, or use int4, int8 or fp16 (weight-only, "
                        "calibrated on text)")
    image_layout = "NCHW"   # unused: language models read text
    teaches_itself = True   # a distill step's default teacher is the original model

    def load(self, source: Any, *, weights: str | None = None, trust_pickle: bool = False,
             tokenizer: Any = None) -> LoadedLm:
        from compressor.backends.llm.load import load_lm
        from compressor.errors import ModelLoadError

        if weights is not None:
            raise ModelLoadError("--weights is for PyTorch state_dicts; a language model's "
                                 "weights come with its folder (save_pretrained) or .gguf file")
        return load_lm(source, tokenizer)

    def trains_step(self, step: Any) -> bool:
        """The language model's training steps: int4 QAT (backends/llm/qat.py), width pruning
        (prune, structure: channel) and distillation (lm_steps.py)."""
        from compressor.schemes import Int4Qat

        if step.kind == "prune":
            return step.structure == "channel"
        return step.kind == "distill" or isinstance(getattr(step, "scheme", None), Int4Qat)

    def prune(self, state: Any, config: Any, ctx: Any) -> Any:
        """Pruning: MLP channels and KV groups removed by activation importance (width_prune.py)."""
        from compressor.backends.llm.lm_steps import prune

        return prune(state, config, ctx)

    def distill(self, state: Any, config: Any, ctx: Any) -> Any:
        """Distilling: the student trained on the teacher's next-token distributions."""
        from compressor.backends.llm.lm_steps import distill

        return distill(state, config, ctx)

    def preflight(self, model: LoadedLm, steps: tuple[Any, ...], formats: tuple[str, ...]) -> None:
        """Preflight: a prune / distill step the model cannot take, refused before any work."""
        from compressor.backends.llm.lm_steps import check_steps

        check_steps(model, steps)

    def clone(self, model: LoadedLm) -> LoadedLm:
        # No copy (a 7B model would need twice the memory): passes never write into the
        # torch model, they return a LoadedLm with quantized integers beside it.
        return model

    def describe(self, model: LoadedLm, example: Arrays | None = None) -> ModelInfo:
        torch_model = model.model
        params = sum(p.numel() for p in torch_model.parameters())
        size = sum(p.numel() * p.element_size() for p in torch_model.parameters())
        vocab = torch_model.config.vocab_size
        return ModelInfo(params=params,
                         inputs=(TensorSpec("input_ids", (None, None), "int64"),),
                         outputs=(TensorSpec("logits", (None, None, vocab), "float32"),),
                         size_bytes=size, layer_kinds=frozenset({"causal_lm"}))

    def predict(self, model: LoadedLm, x: Arrays, batch_size: int = PREDICT_BATCH) -> Arrays:
        """Teacher-forced next-token outputs on token windows [N, T] (lm_metrics)."""
        import numpy as np
        import torch

        windows = x["input_ids"] if isinstance(x, dict) else x
        next_tokens, logprobs = [], []
        with torch.no_grad(), _computing_with(model):
            for start in range(0, len(windows), batch_size):
                ids = torch.as_tensor(np.asarray(windows[start:start + batch_size]))
                logits = model.model(input_ids=ids, use_cache=False).logits.to(torch.float32)
                logp = torch.log_softmax(logits[:, :-1], dim=-1)
                logprobs.append(logp.gather(-1, ids[:, 1:, None])[..., 0].double().numpy())
                next_tokens.append(logits.argmax(-1).numpy())
        return {NEXT_TOKEN: np.concatenate(next_tokens), TOKEN_LOGPROB: np.concatenate(logprobs)}

    def generate(self, model: LoadedLm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        import torch

        with torch.no_grad(), _computing_with(model):
            ids = torch.tensor([prompt_ids])
            out = model.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                       do_sample=False, pad_token_id=_pad_id(model))
        return out[0, len(prompt_ids):].tolist()


def _pad_id(model: LoadedLm) -> int:
    tokenizer = model.tokenizer
    for token_id in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if token_id is not None:
            return token_id
    return 0


def _computing_with(model: LoadedLm):
    """The torch model with the quantized weights swapped in (and restored after), so that
    predict / generate of a quantized state show what its integers compute."""
    import contextlib

    if not model.quantized:
        return contextlib.nullcontext()
    from compressor.backends.llm.quantize import quantized_weights

    return quantized_weights(model)
