"""The LLM bench's evaluation windows and its KL from the float model of any logits
(bench/llm_closeness.py)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench.llm_closeness import held_out, kl_from_logits  # noqa: E402
from compressor.backends.llm.candidates import KlScorer  # noqa: E402
from compressor.backends.llm.layer_inputs import CALIBRATION_BATCH  # noqa: E402
from compressor.tasks.lm.text_data import TextData  # noqa: E402
from support import tiny_lm  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    calibration, _ = tiny_lm.builtin_texts()
    return tiny_lm.train_tokenizer(calibration, vocab_size=256)


def test_held_out_is_every_window_of_the_evaluation_text(tokenizer):
    windows = held_out(tokenizer)
    _, default = TextData().windows(tokenizer)
    _, text = TextData().texts()
    body = windows.shape[1] - 1   # the tokenizer prepends a BOS to every window
    assert windows.shape[1] == default.shape[1] == 256
    assert len(windows) == len(tokenizer(text, add_special_tokens=False)["input_ids"]) // body
    assert len(windows) > 2 * len(default)


def test_kl_is_zero_for_the_float_model_and_matches_torch_for_another(tokenizer):
    model = tiny_lm.random_lm(tokenizer).eval()
    windows = held_out(tokenizer)[: CALIBRATION_BATCH + 2]   # two batches, the last one short
    reference = KlScorer(model, windows)

    def logits(of):
        return lambda batch: of(input_ids=torch.from_numpy(batch)).logits

    assert abs(kl_from_logits(reference, logits(model))) < 1e-5
    other = tiny_lm.random_lm(tokenizer, seed=1).eval()
    with torch.no_grad():
        ids = torch.from_numpy(np.asarray(windows))
        log_p = torch.log_softmax(model(input_ids=ids).logits, -1)
        log_q = torch.log_softmax(other(input_ids=ids).logits, -1)
    expected = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
    got = kl_from_logits(reference, logits(other))
    assert expected > 0.01
    assert got == pytest.approx(expected, rel=2e-3)   # p is kept in float16
